use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tern_codec::RequestError;

pub use crate::handler::AnswerRow;
pub use crate::upstream::UpstreamRow;

/// Every counter a worker keeps besides the answers (counted per site and route,
/// [`AnswerRow`]) and the upstream exchanges (per group, [`UpstreamCounter`]).
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
    /// Panics, by where they were contained (`tern_panics_total{where}`): in a handler
    /// (answered 500), in a connection's own code (that connection closed), or nowhere (the
    /// worker was lost; tern then stops and exits with an error, see `runtime/src/worker.rs`).
    HandlerPanics,
    ConnectionPanics,
    WorkerPanics,
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
    /// WebSocket tunnels through the reverse proxy (an upstream's `101`), by the client's
    /// protocol: an HTTP/1.1 upgrade or an HTTP/2 extended CONNECT (RFC 8441); and those that
    /// ended (both protocols).
    WebsocketTunnelsOpenedHttp1,
    WebsocketTunnelsOpenedHttp2,
    WebsocketTunnelsClosed,
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
    /// Answers sent uncompressed because the encoder budget (the worker's, or the
    /// connection's) was spent.
    CompressionSkippedMemory,
    /// The io_uring backend's work (`--io uring`): operations queued, completions taken,
    /// `io_uring_enter` calls, multishot receives started again, receives that found the
    /// buffer ring empty, buffers given back early (their unread bytes copied out).
    IoUringSubmissions,
    IoUringCompletions,
    IoUringEnters,
    IoUringRearms,
    IoUringBufferExhaustions,
    IoUringBuffersReclaimed,
}

impl Counter {
    pub const ALL: [Counter; 51] = [
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
        Counter::ConnectionPanics,
        Counter::WorkerPanics,
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
        Counter::WebsocketTunnelsOpenedHttp1,
        Counter::WebsocketTunnelsOpenedHttp2,
        Counter::WebsocketTunnelsClosed,
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
        Counter::CompressionSkippedMemory,
        Counter::IoUringSubmissions,
        Counter::IoUringCompletions,
        Counter::IoUringEnters,
        Counter::IoUringRearms,
        Counter::IoUringBufferExhaustions,
        Counter::IoUringBuffersReclaimed,
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
            Counter::HandlerPanics | Counter::ConnectionPanics | Counter::WorkerPanics => "panics",
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
            Counter::WebsocketTunnelsOpenedHttp1 | Counter::WebsocketTunnelsOpenedHttp2 => {
                "websocket_tunnels_opened"
            }
            Counter::WebsocketTunnelsClosed => "websocket_tunnels_closed",
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
            Counter::CompressionSkippedMemory => "compression_skipped",
            Counter::IoUringSubmissions => "io_uring_submissions",
            Counter::IoUringCompletions => "io_uring_completions",
            Counter::IoUringEnters => "io_uring_enters",
            Counter::IoUringRearms => "io_uring_rearms",
            Counter::IoUringBufferExhaustions => "io_uring_buffer_exhaustions",
            Counter::IoUringBuffersReclaimed => "io_uring_buffers_reclaimed",
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
            Counter::CompressionSkippedMemory => ("cause", "memory"),
            Counter::HandlerPanics => ("where", "handler"),
            Counter::ConnectionPanics => ("where", "connection"),
            Counter::WorkerPanics => ("where", "worker"),
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
            Counter::HandlerPanics | Counter::ConnectionPanics | Counter::WorkerPanics => {
                "panics, by where they were contained: a handler (answered 500), a \
                 connection's code (that connection closed), none (a worker lost; tern exits)"
            }
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
            Counter::WebsocketTunnelsOpenedHttp1 | Counter::WebsocketTunnelsOpenedHttp2 => {
                "WebSocket tunnels opened to upstreams, by the client's protocol: an HTTP/1.1 \
                 upgrade (http1) or an HTTP/2 extended CONNECT (http2)"
            }
            Counter::WebsocketTunnelsClosed => "WebSocket tunnels to upstreams that ended",
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
            Counter::CompressionSkippedMemory => {
                "answers sent uncompressed that would have been compressed: the encoder \
                 budget of the worker or of the connection was spent"
            }
            Counter::IoUringSubmissions => "operations queued on the workers' io_uring rings",
            Counter::IoUringCompletions => "completions taken from the workers' io_uring rings",
            Counter::IoUringEnters => {
                "io_uring_enter calls (one per event-loop turn, more when a queue fills)"
            }
            Counter::IoUringRearms => "multishot receives started again after they ended",
            Counter::IoUringBufferExhaustions => {
                "receives that found the io_uring provided-buffer ring empty"
            }
            Counter::IoUringBuffersReclaimed => {
                "io_uring receive buffers given back while the ring was dry, their unread bytes copied out"
            }
        }
    }
}

/// The reverse proxy's counters, kept per upstream group ([`UpstreamRow`]): a group's
/// figures are what its route's upstreams did. The pages show them by `upstream` label, and
/// `/statusz` also the process's totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum UpstreamCounter {
    /// New connections to upstream servers.
    Connects,
    /// Requests sent on a pooled upstream connection.
    Reuses,
    /// Upstream connections that could not be made (refused, unreachable, timed out).
    ConnectFailures,
    /// Upstream exchanges that failed: no answer, a malformed or cut-short answer, 502/504.
    Failures,
    /// Upstream connect, first-byte or idle timeouts.
    Timeouts,
    /// Idempotent requests sent again after a pooled connection turned out dead.
    RetriesStale,
    /// Requests sent to the next server after a connect failure.
    RetriesConnect,
    /// Idempotent requests sent to the next server after a 502, 503 or 504 answer.
    RetriesStatus,
    /// TLS handshakes with upstream servers that succeeded.
    TlsHandshakes,
    /// TLS handshakes with upstream servers that failed, by cause
    /// ([`UpstreamCounter::tls_failure`]).
    TlsFailUnknownCa,
    TlsFailNameMismatch,
    TlsFailExpired,
    TlsFailOther,
}

impl UpstreamCounter {
    /// Counters of one name are adjacent, as the page needs.
    pub const ALL: [UpstreamCounter; 13] = [
        UpstreamCounter::Connects,
        UpstreamCounter::Reuses,
        UpstreamCounter::ConnectFailures,
        UpstreamCounter::Failures,
        UpstreamCounter::Timeouts,
        UpstreamCounter::RetriesStale,
        UpstreamCounter::RetriesConnect,
        UpstreamCounter::RetriesStatus,
        UpstreamCounter::TlsHandshakes,
        UpstreamCounter::TlsFailUnknownCa,
        UpstreamCounter::TlsFailNameMismatch,
        UpstreamCounter::TlsFailExpired,
        UpstreamCounter::TlsFailOther,
    ];

    /// The failure counter for a cause named by `tern_tls::upstream::failure_cause`.
    pub fn tls_failure(cause: &str) -> UpstreamCounter {
        match cause {
            "unknown_ca" => UpstreamCounter::TlsFailUnknownCa,
            "name_mismatch" => UpstreamCounter::TlsFailNameMismatch,
            "expired" => UpstreamCounter::TlsFailExpired,
            _ => UpstreamCounter::TlsFailOther,
        }
    }

    /// The metric's name, as [`Counter::name`].
    pub fn name(self) -> &'static str {
        match self {
            UpstreamCounter::Connects => "upstream_connects",
            UpstreamCounter::Reuses => "upstream_reuses",
            UpstreamCounter::ConnectFailures => "upstream_connect_failures",
            UpstreamCounter::Failures => "upstream_failures",
            UpstreamCounter::Timeouts => "upstream_timeouts",
            UpstreamCounter::RetriesStale
            | UpstreamCounter::RetriesConnect
            | UpstreamCounter::RetriesStatus => "upstream_retries",
            UpstreamCounter::TlsHandshakes => "upstream_tls_handshakes",
            UpstreamCounter::TlsFailUnknownCa
            | UpstreamCounter::TlsFailNameMismatch
            | UpstreamCounter::TlsFailExpired
            | UpstreamCounter::TlsFailOther => "upstream_tls_failures",
        }
    }

    /// The label that tells this counter from the others of its name, as [`Counter::label`].
    pub fn label(self) -> Option<(&'static str, &'static str)> {
        let value = match self {
            UpstreamCounter::RetriesStale => "stale_connection",
            UpstreamCounter::RetriesConnect => "connect",
            UpstreamCounter::RetriesStatus => "status",
            UpstreamCounter::TlsFailUnknownCa => "unknown_ca",
            UpstreamCounter::TlsFailNameMismatch => "name_mismatch",
            UpstreamCounter::TlsFailExpired => "expired",
            UpstreamCounter::TlsFailOther => "other",
            _ => return None,
        };
        Some(("cause", value))
    }

    pub fn help(self) -> &'static str {
        match self {
            UpstreamCounter::Connects => "new connections to upstream servers, by upstream group",
            UpstreamCounter::Reuses => {
                "requests sent on a pooled upstream connection, by upstream group"
            }
            UpstreamCounter::ConnectFailures => {
                "upstream connections that could not be made, by upstream group"
            }
            UpstreamCounter::Failures => {
                "upstream exchanges that failed (502, 504, cut short), by upstream group"
            }
            UpstreamCounter::Timeouts => {
                "upstream connect, first-byte or idle timeouts, by upstream group"
            }
            UpstreamCounter::RetriesStale
            | UpstreamCounter::RetriesConnect
            | UpstreamCounter::RetriesStatus => {
                "requests sent again, by upstream group: on a new connection after a dead \
                 pooled one (stale_connection), to the next server after a connect failure \
                 (connect) or a 502/503/504 answer (status)"
            }
            UpstreamCounter::TlsHandshakes => {
                "TLS handshakes with upstream servers, by upstream group"
            }
            UpstreamCounter::TlsFailUnknownCa
            | UpstreamCounter::TlsFailNameMismatch
            | UpstreamCounter::TlsFailExpired
            | UpstreamCounter::TlsFailOther => {
                "failed TLS handshakes with upstream servers, by upstream group and cause (a \
                 certificate from an unknown CA, for another name, expired; other)"
            }
        }
    }
}

const N_COUNTERS: usize = Counter::ALL.len();
const N_BAD: usize = RequestError::ALL.len();
const N_UPSTREAM: usize = UpstreamCounter::ALL.len();

/// How many sites get figures of their own (answers by class, a duration histogram): the
/// first rows of answer figures ([`AnswerRow`]), one per site. Row 0 is for answers no site
/// took (a server without sites, bad input, a misdirected host); sites past the last row
/// share it ([`OTHER`]), which bounds the label's values.
pub const MAX_SITES: usize = 64;

/// How many rows of answer figures there are in all: the sites' ([`MAX_SITES`]), then the
/// routes'. Routes past the bound share the last row, reported as site and route [`OTHER`].
/// A worker holds memory only for the rows in use, a chunk of [`ANSWER_CHUNK`] at a time.
pub const MAX_ANSWER_ROWS: usize = 512;

/// Answer rows are allocated this many at a time (about 11.5 KiB a worker).
pub const ANSWER_CHUNK: usize = MAX_SITES;

/// How many upstream groups get counters of their own ([`UpstreamRow`]); row 0 is for
/// exchanges of no named group, the last is shared by the groups past the bound ([`OTHER`]).
pub const MAX_UPSTREAMS: usize = 256;

/// Upstream rows are allocated this many at a time (about 3.3 KiB a worker).
pub const UPSTREAM_CHUNK: usize = 32;

/// The name a shared last row reports: sites past [`MAX_SITES`], routes past
/// [`MAX_ANSWER_ROWS`], upstream groups past [`MAX_UPSTREAMS`].
pub const OTHER: &str = "_other";

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

/// What an answer is counted under: its row (site or route), and when its request was
/// complete (the worker clock's microseconds), for the duration histogram. One word (the row
/// in the top 16 bits, 48 bits of microseconds: 8.9 years of uptime), since every
/// connection's state carries one and an idle connection must stay small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally(u64);

const START_BITS: u32 = 48;
const START_MASK: u64 = (1 << START_BITS) - 1;

// The row must fit the 16 bits above the start.
const _: () = assert!(MAX_ANSWER_ROWS <= 1 << (64 - START_BITS));

impl Tally {
    pub fn starting(start_us: u64) -> Tally {
        Tally::new(AnswerRow::NONE, start_us)
    }

    pub fn new(row: AnswerRow, start_us: u64) -> Tally {
        Tally(u64::from(row.0) << START_BITS | (start_us & START_MASK))
    }

    pub fn row(self) -> AnswerRow {
        AnswerRow((self.0 >> START_BITS) as u16)
    }

    pub fn start_us(self) -> u64 {
        self.0 & START_MASK
    }

    pub fn set_row(&mut self, row: AnswerRow) {
        *self = Tally::new(row, self.start_us());
    }
}

/// One row's answer figures (a site's or a route's) in one worker's block.
#[derive(Default)]
struct AnswerCells {
    classes: [AtomicU64; STATUS_CLASSES.len()],
    buckets: [AtomicU64; DURATION_BUCKETS],
    sum_us: AtomicU64,
}

/// One upstream group's counters in one worker's block.
#[derive(Default)]
struct UpstreamCells([AtomicU64; N_UPSTREAM]);

/// A chunk of rows, alone on its cache lines (each worker's are its own allocation).
#[repr(align(128))]
struct Chunk<T, const N: usize>([T; N]);

fn new_chunk<T: Default, const N: usize>() -> Box<Chunk<T, N>> {
    Box::new(Chunk(std::array::from_fn(|_| T::default())))
}

/// One kind of rows in one worker's block: `N` rows always there, `MORE` chunks of `N`
/// allocated when a name first needs a row in them ([`Rows::reserve`], at start-up or a
/// reload, never on the request path), so a worker holds memory for the rows in use.
struct Rows<T, const N: usize, const MORE: usize> {
    first: Box<Chunk<T, N>>,
    more: [OnceLock<Box<Chunk<T, N>>>; MORE],
}

impl<T: Default, const N: usize, const MORE: usize> Rows<T, N, MORE> {
    const CAPACITY: usize = N * (1 + MORE);

    fn new() -> Self {
        Rows {
            first: new_chunk(),
            more: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Row `i`, if its chunk is there.
    #[inline]
    fn get(&self, i: usize) -> Option<&T> {
        match i.checked_sub(N) {
            None => self.first.0.get(i),
            Some(past) => Some(&self.more.get(past / N)?.get()?.0[past % N]),
        }
    }

    /// Row `i` for counting into: row 0 if its chunk is not there, which cannot happen to a
    /// row a name was given (its chunk is reserved first, in every block).
    #[inline]
    fn counted(&self, i: usize) -> &T {
        self.get(i).unwrap_or(&self.first.0[0])
    }

    /// Makes sure row `i`'s chunk is there.
    fn reserve(&self, i: usize) {
        if let Some(chunk) = i.checked_sub(N).and_then(|past| self.more.get(past / N)) {
            chunk.get_or_init(new_chunk);
        }
    }

    /// The bytes this block's rows take now.
    fn bytes(&self) -> usize {
        let chunks = 1 + self.more.iter().filter(|c| c.get().is_some()).count();
        chunks * std::mem::size_of::<Chunk<T, N>>()
    }
}

type AnswerRows = Rows<AnswerCells, ANSWER_CHUNK, { MAX_ANSWER_ROWS / ANSWER_CHUNK - 1 }>;
type UpstreamRows = Rows<UpstreamCells, UPSTREAM_CHUNK, { MAX_UPSTREAMS / UPSTREAM_CHUNK - 1 }>;

const _: () = assert!(AnswerRows::CAPACITY == MAX_ANSWER_ROWS);
const _: () = assert!(UpstreamRows::CAPACITY == MAX_UPSTREAMS);

/// One worker's counters, alone on its cache lines so workers never contend. Each worker is the
/// only writer of its block, so increments are a plain load + store (no locked instruction);
/// readers sum all blocks with relaxed loads.
#[repr(align(128))]
pub struct WorkerStats {
    counters: [AtomicU64; N_COUNTERS],
    bad_requests: [AtomicU64; N_BAD],
    answers: AnswerRows,
    upstreams: UpstreamRows,
    /// The worker's streaming encoders: what their state is charged now, against
    /// [`WORKER_ENCODER_BUDGET`] (kept here so the pages read it as they read counters).
    encoders: Arc<tern_compress::Budget>,
}

/// The most streaming-encoder state one worker holds at once: about 15 brotli or zstd
/// answers in flight at the default levels, 78 gzip ones. Past it, answers that would be
/// compressed on the fly go uncompressed until some end (counted), so clients that open
/// compressed answers and never read them cannot make a worker allocate without bound.
pub const WORKER_ENCODER_BUDGET: usize = 32 << 20;

impl WorkerStats {
    fn new() -> WorkerStats {
        WorkerStats {
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            bad_requests: std::array::from_fn(|_| AtomicU64::new(0)),
            answers: Rows::new(),
            upstreams: Rows::new(),
            encoders: tern_compress::Budget::new(WORKER_ENCODER_BUDGET),
        }
    }

    /// The budget this worker's streaming encoders are charged to.
    pub fn encoders(&self) -> &Arc<tern_compress::Budget> {
        &self.encoders
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

    /// Counts `c` for the upstream group of `row` (single writer, like `bump`).
    #[inline]
    pub fn bump_upstream(&self, row: UpstreamRow, c: UpstreamCounter) {
        bump(&self.upstreams.counted(row.index()).0[c as usize]);
    }

    /// An answer with `status` went out at `now_us` (the worker clock's microseconds): its
    /// class and its duration are counted in its row (its route's, or its site's). Three
    /// single-writer increments.
    #[inline]
    pub(crate) fn answered(&self, status: u16, tally: Tally, now_us: u64) {
        let row = self.answers.counted(tally.row().index());
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        bump(&row.classes[class]);
        let us = (now_us & START_MASK).saturating_sub(tally.start_us());
        bump(&row.buckets[duration_bucket(us)]);
        add(&row.sum_us, us);
    }

    /// The bytes this block takes now: its counters and the chunks of rows it holds.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<WorkerStats>() + self.answers.bytes() + self.upstreams.bytes()
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

/// Which rows have been given to which names. Only start-up, reloads and the pages take
/// its lock.
struct Names {
    /// The sites' names by row (row 0, no site, is ""), in the order they were first named.
    sites: Vec<String>,
    /// The routes' rows from [`MAX_SITES`] on: the row of their site, and their label.
    routes: Vec<(AnswerRow, String)>,
    /// The upstream groups' names by row (row 0, no named group, is "").
    upstreams: Vec<String>,
}

/// All workers' counters; cheap to clone, summed on demand for /statusz and /metrics.
#[derive(Clone)]
pub struct Stats {
    workers: Arc<[WorkerStats]>,
    names: Arc<Mutex<Names>>,
}

/// One row's figures summed over the workers: a site's own (`route` empty: answers of the
/// site no route took) or a route's.
#[derive(Debug, Clone)]
pub struct AnswerFigures {
    /// "" for answers no site took.
    pub site: String,
    /// "" for a site's own row.
    pub route: String,
    /// Answers by class ([`STATUS_CLASSES`]).
    pub responses: [u64; STATUS_CLASSES.len()],
    /// Answers by duration: bucket i holds those above bound i - 1 up to bound i
    /// ([`DURATION_BOUNDS`]), the last those above every bound. Not cumulative.
    pub buckets: [u64; DURATION_BUCKETS],
    /// The durations' sum in microseconds.
    pub sum_us: u64,
}

/// One upstream group's counters summed over the workers.
#[derive(Debug, Clone)]
pub struct UpstreamFigures {
    /// "" for exchanges of no named group.
    pub name: String,
    pub counts: [u64; N_UPSTREAM],
}

impl UpstreamFigures {
    pub fn get(&self, c: UpstreamCounter) -> u64 {
        self.counts[c as usize]
    }
}

/// A point-in-time sum over all workers.
#[derive(Debug, Clone)]
pub struct StatsSnapshot {
    pub counters: [u64; N_COUNTERS],
    pub bad_requests: [u64; N_BAD],
    /// Row 0 (no site) first, then every site named so far, then every route, in row order.
    pub answers: Vec<AnswerFigures>,
    /// Row 0 (no named group) first, then every upstream group named so far.
    pub upstreams: Vec<UpstreamFigures>,
    /// Streaming-encoder state charged now, over all workers, and what they may charge.
    pub encoder_bytes: u64,
    pub encoder_budget: u64,
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

    /// Answers of status class `class` (1 to 5) over every row.
    pub fn responses(&self, class: usize) -> u64 {
        self.answers.iter().map(|s| s.responses[class - 1]).sum()
    }

    /// The figures of the route labelled `route` on `site` ("": the site's own row).
    pub fn answers_of(&self, site: &str, route: &str) -> Option<&AnswerFigures> {
        self.answers
            .iter()
            .find(|f| f.site == site && f.route == route)
    }

    /// `c` over every upstream group.
    pub fn upstream_total(&self, c: UpstreamCounter) -> u64 {
        self.upstreams.iter().map(|u| u.get(c)).sum()
    }

    /// `c` of the upstream group called `name` (0 if there is none).
    pub fn upstream(&self, name: &str, c: UpstreamCounter) -> u64 {
        self.upstreams
            .iter()
            .find(|u| u.name == name)
            .map_or(0, |u| u.get(c))
    }
}

impl Stats {
    pub fn new(workers: usize) -> Stats {
        Stats {
            // One block more than workers: `aux`, for a thread that is not a worker.
            workers: (0..workers.max(1) + 1)
                .map(|_| WorkerStats::new())
                .collect(),
            names: Arc::new(Mutex::new(Names {
                sites: vec![String::new()],
                routes: Vec::new(),
                upstreams: vec![String::new()],
            })),
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

    /// The workers' blocks: every block but `aux`, which counts neither answers nor
    /// upstream exchanges.
    fn worker_blocks(&self) -> &[WorkerStats] {
        &self.workers[..self.workers.len() - 1]
    }

    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The row of the site called `name`: the one it had if it was named before (a reload
    /// keeps a site's figures), else the next free one; once all are taken, the shared last
    /// one, reported as [`OTHER`]. Not for the request path (it takes a lock).
    pub fn site(&self, name: &str) -> AnswerRow {
        let mut names = self.names();
        AnswerRow(name_row(&mut names.sites, name, MAX_SITES) as u16)
    }

    /// The row of the route labelled `label` on the site of row `site` (a route's `name`, or
    /// its path as written): the one it had if it was named before, else the next free one,
    /// its chunk reserved in every worker's block; once all are taken, the shared last one,
    /// reported as site and route [`OTHER`]. Routes of one site with one label share a row.
    /// Not for the request path (it takes a lock, and may allocate a chunk).
    pub fn route(&self, site: AnswerRow, label: &str) -> AnswerRow {
        let mut names = self.names();
        let site = AnswerRow(site.index().min(MAX_SITES - 1) as u16);
        let routes = &mut names.routes;
        let last = MAX_ANSWER_ROWS - MAX_SITES - 1;
        let index = match routes.iter().position(|(s, l)| *s == site && l == label) {
            Some(i) => i,
            None if routes.len() < last => {
                routes.push((site, label.to_owned()));
                routes.len() - 1
            }
            None => {
                if routes.len() == last {
                    routes.push((AnswerRow(OTHER_ROW), OTHER.to_owned()));
                }
                last
            }
        };
        let row = MAX_SITES + index;
        for w in self.worker_blocks() {
            w.answers.reserve(row);
        }
        AnswerRow(row as u16)
    }

    /// The row of the upstream group called `name` (`"SITE ROUTE"` in `tern run`, as its
    /// health figures are labelled): as [`Stats::site`], with its chunk reserved in every
    /// worker's block. Not for the request path.
    pub fn upstream(&self, name: &str) -> UpstreamRow {
        let mut names = self.names();
        let row = name_row(&mut names.upstreams, name, MAX_UPSTREAMS);
        for w in self.worker_blocks() {
            w.upstreams.reserve(row);
        }
        UpstreamRow(row as u16)
    }

    /// The bytes one worker's block takes now (every worker holds the same chunks).
    pub fn worker_bytes(&self) -> usize {
        self.worker(0).bytes()
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let (sites, routes, upstreams) = {
            let names = self.names();
            (
                names.sites.clone(),
                names.routes.clone(),
                names.upstreams.clone(),
            )
        };
        let figures = |row: usize, site: &str, route: &str| {
            AnswerFigures {
                site: site.to_owned(),
                route: route.to_owned(),
                responses: [0; STATUS_CLASSES.len()],
                buckets: [0; DURATION_BUCKETS],
                sum_us: 0,
            }
            .summed(row, self.worker_blocks())
        };
        let mut answers: Vec<AnswerFigures> = sites
            .iter()
            .enumerate()
            .map(|(row, site)| figures(row, site, ""))
            .collect();
        answers.extend(routes.iter().enumerate().map(|(i, (site, route))| {
            let site = if site.0 == OTHER_ROW {
                OTHER
            } else {
                sites.get(site.index()).map_or("", String::as_str)
            };
            figures(MAX_SITES + i, site, route)
        }));
        let upstreams = upstreams
            .into_iter()
            .enumerate()
            .map(|(row, name)| {
                let mut counts = [0; N_UPSTREAM];
                for w in self.worker_blocks() {
                    if let Some(cells) = w.upstreams.get(row) {
                        for (sum, c) in counts.iter_mut().zip(&cells.0) {
                            *sum += c.load(Ordering::Relaxed);
                        }
                    }
                }
                UpstreamFigures { name, counts }
            })
            .collect();
        let mut s = StatsSnapshot {
            counters: [0; N_COUNTERS],
            bad_requests: [0; N_BAD],
            answers,
            upstreams,
            encoder_bytes: 0,
            encoder_budget: 0,
        };
        for w in self.worker_blocks() {
            s.encoder_bytes += w.encoders.live() as u64;
            s.encoder_budget += w.encoders.limit() as u64;
        }
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

/// A marker in a route row's site: the shared last route row, whose site is [`OTHER`].
const OTHER_ROW: u16 = u16::MAX;

/// The row of `name` in `rows` (bounded by `max`): the one it had, else the next free one,
/// else the shared last one, named [`OTHER`].
fn name_row(rows: &mut Vec<String>, name: &str, max: usize) -> usize {
    match rows.iter().position(|n| n == name) {
        Some(i) => i,
        _ if rows.len() < max - 1 => {
            rows.push(name.to_owned());
            rows.len() - 1
        }
        _ => {
            if rows.len() < max {
                rows.push(OTHER.to_owned());
            }
            max - 1
        }
    }
}

impl AnswerFigures {
    /// These figures plus row `row` of every block.
    fn summed(mut self, row: usize, blocks: &[WorkerStats]) -> AnswerFigures {
        for w in blocks {
            let Some(cells) = w.answers.get(row) else {
                continue;
            };
            for (sum, c) in self.responses.iter_mut().zip(&cells.classes) {
                *sum += c.load(Ordering::Relaxed);
            }
            for (sum, c) in self.buckets.iter_mut().zip(&cells.buckets) {
                *sum += c.load(Ordering::Relaxed);
            }
            self.sum_us += cells.sum_us.load(Ordering::Relaxed);
        }
        self
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
        assert_eq!(stats.site("a"), a, "a site named again keeps its row");
        let at = Tally::new;
        stats.worker(0).answered(200, at(a, 1_000), 1_050); // 50 µs: the first bucket
        stats.worker(1).answered(200, at(a, 1_000), 1_100); // on the bound: still the first
        stats.worker(1).answered(503, at(a, 0), 20_000_000); // past every bound
        stats.worker(0).answered(301, at(b, 0), 3_000); // 3 ms: (2.5 ms, 5 ms]
        stats.worker(0).answered(400, Tally::starting(0), 0);
        let s = stats.snapshot();
        let names: Vec<(&str, &str)> = s
            .answers
            .iter()
            .map(|f| (f.site.as_str(), f.route.as_str()))
            .collect();
        assert_eq!(names, [("", ""), ("a", ""), ("b", "")]);
        let (none, a, b) = (&s.answers[0], &s.answers[1], &s.answers[2]);
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
    fn routes_get_rows_of_their_own_that_know_their_site() {
        let stats = Stats::new(2);
        let blog = stats.site("blog");
        let shop = stats.site("shop");
        let posts = stats.route(blog, "/posts");
        let api = stats.route(shop, "api");
        let shop_root = stats.route(shop, "/");
        let blog_root = stats.route(blog, "/");
        assert_eq!(
            posts,
            AnswerRow(MAX_SITES as u16),
            "route rows follow the sites'"
        );
        assert_eq!(
            stats.route(shop, "api"),
            api,
            "a route named again keeps its row"
        );
        assert_ne!(shop_root, blog_root, "one label on two sites: two rows");
        let at = Tally::new;
        stats.worker(0).answered(200, at(posts, 0), 40);
        stats.worker(1).answered(200, at(posts, 0), 300); // (250 µs, 500 µs]
        stats.worker(1).answered(502, at(api, 0), 7_000);
        stats.worker(0).answered(404, at(shop, 0), 10);
        let s = stats.snapshot();
        let rows: Vec<(&str, &str)> = s
            .answers
            .iter()
            .map(|f| (f.site.as_str(), f.route.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("", ""),
                ("blog", ""),
                ("shop", ""),
                ("blog", "/posts"),
                ("shop", "api"),
                ("shop", "/"),
                ("blog", "/"),
            ]
        );
        assert_eq!(s.answers[3].responses, [0, 2, 0, 0, 0]);
        assert_eq!(s.answers[3].buckets[0], 1);
        assert_eq!(s.answers[3].buckets[2], 1);
        assert_eq!(s.answers[3].sum_us, 340);
        assert_eq!(s.answers[4].responses, [0, 0, 0, 0, 1]);
        assert_eq!(s.answers[4].buckets[6], 1);
        assert_eq!(s.answers[2].responses, [0, 0, 0, 1, 0]);
        assert_eq!(s.answers[5].responses, [0; 5]);
        assert_eq!(s.responses(2), 2);
    }

    #[test]
    fn route_rows_are_bounded_and_the_rest_share_one() {
        let stats = Stats::new(2);
        let site = stats.site("big");
        let rows: Vec<AnswerRow> = (0..MAX_ANSWER_ROWS)
            .map(|i| stats.route(site, &format!("/r{i}")))
            .collect();
        let own = MAX_ANSWER_ROWS - MAX_SITES - 1;
        let other = AnswerRow((MAX_ANSWER_ROWS - 1) as u16);
        assert_eq!(rows[own - 1], AnswerRow((MAX_ANSWER_ROWS - 2) as u16));
        assert!(
            rows[own..].iter().all(|&r| r == other),
            "past the bound: one row"
        );
        assert_eq!(stats.route(site, "/r0"), rows[0], "rows given stay");
        stats.worker(1).answered(200, Tally::new(other, 0), 0);
        stats
            .worker(0)
            .answered(200, Tally::new(rows[own - 1], 0), 0);
        let s = stats.snapshot();
        assert_eq!(
            s.answers.len(),
            2 + MAX_ANSWER_ROWS - MAX_SITES,
            "no site, big, routes"
        );
        let last = s.answers.last().unwrap();
        assert_eq!((last.site.as_str(), last.route.as_str()), (OTHER, OTHER));
        assert_eq!(last.responses[1], 1);
        let before = &s.answers[s.answers.len() - 2];
        assert_eq!(before.route, format!("/r{}", own - 1));
        assert_eq!(before.responses[1], 1);
        // Every chunk is there now, and only then.
        let chunk = std::mem::size_of::<Chunk<AnswerCells, ANSWER_CHUNK>>();
        assert_eq!(
            stats.worker(0).answers.bytes(),
            MAX_ANSWER_ROWS / ANSWER_CHUNK * chunk
        );
    }

    #[test]
    fn chunks_are_allocated_for_the_rows_in_use_only() {
        let stats = Stats::new(2);
        let answers = std::mem::size_of::<Chunk<AnswerCells, ANSWER_CHUNK>>();
        let upstreams = std::mem::size_of::<Chunk<UpstreamCells, UPSTREAM_CHUNK>>();
        let base = std::mem::size_of::<WorkerStats>() + answers + upstreams;
        assert_eq!(
            stats.worker_bytes(),
            base,
            "the sites' rows and row 0 of upstreams"
        );
        let site = stats.site("a");
        stats.route(site, "/");
        assert_eq!(stats.worker_bytes(), base + answers);
        for i in 0..ANSWER_CHUNK {
            stats.route(site, &format!("/{i}"));
        }
        assert_eq!(
            stats.worker_bytes(),
            base + 2 * answers,
            "a second chunk of routes"
        );
        for i in 0..UPSTREAM_CHUNK {
            stats.upstream(&format!("a /{i}"));
        }
        assert_eq!(stats.worker_bytes(), base + 2 * answers + upstreams);
        assert_eq!(
            stats.worker(1).bytes(),
            stats.worker_bytes(),
            "every worker alike"
        );
        assert_eq!(
            stats.aux().bytes(),
            base,
            "the aux block counts neither answers nor upstreams"
        );
        // The figures of the rows reported in the report's words.
        assert!(answers <= 64 * 192, "{answers}");
        assert!(upstreams <= 32 * 112, "{upstreams}");
    }

    #[test]
    fn upstream_counters_are_kept_per_group() {
        let stats = Stats::new(2);
        let api = stats.upstream("shop /api");
        let wiki = stats.upstream("wiki /");
        assert_eq!(stats.upstream("shop /api"), api);
        stats
            .worker(0)
            .bump_upstream(api, UpstreamCounter::Connects);
        stats
            .worker(1)
            .bump_upstream(api, UpstreamCounter::Connects);
        stats
            .worker(1)
            .bump_upstream(api, UpstreamCounter::RetriesStatus);
        stats
            .worker(0)
            .bump_upstream(wiki, UpstreamCounter::tls_failure("unknown_ca"));
        stats
            .worker(0)
            .bump_upstream(UpstreamRow::NONE, UpstreamCounter::Reuses);
        let s = stats.snapshot();
        let names: Vec<&str> = s.upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["", "shop /api", "wiki /"]);
        assert_eq!(s.upstream("shop /api", UpstreamCounter::Connects), 2);
        assert_eq!(s.upstream("shop /api", UpstreamCounter::RetriesStatus), 1);
        assert_eq!(s.upstream("wiki /", UpstreamCounter::TlsFailUnknownCa), 1);
        assert_eq!(s.upstream("wiki /", UpstreamCounter::Connects), 0);
        assert_eq!(s.upstream("", UpstreamCounter::Reuses), 1);
        assert_eq!(s.upstream_total(UpstreamCounter::Connects), 2);
        assert_eq!(s.upstream_total(UpstreamCounter::Reuses), 1);
    }

    #[test]
    fn upstream_rows_are_bounded_and_the_rest_share_one() {
        let stats = Stats::new(1);
        let rows: Vec<UpstreamRow> = (0..MAX_UPSTREAMS + 5)
            .map(|i| stats.upstream(&format!("s /{i}")))
            .collect();
        let other = UpstreamRow((MAX_UPSTREAMS - 1) as u16);
        assert_eq!(rows[0], UpstreamRow(1));
        assert!(rows[MAX_UPSTREAMS - 2..].iter().all(|&r| r == other));
        stats
            .worker(0)
            .bump_upstream(rows[MAX_UPSTREAMS], UpstreamCounter::Timeouts);
        let s = stats.snapshot();
        assert_eq!(s.upstreams.len(), MAX_UPSTREAMS);
        assert_eq!(s.upstream(OTHER, UpstreamCounter::Timeouts), 1);
    }

    #[test]
    fn upstream_counters_have_one_name_per_quantity_and_causes_as_labels() {
        let mut seen: Vec<&str> = Vec::new();
        for c in UpstreamCounter::ALL {
            assert_eq!(
                UpstreamCounter::ALL[c as usize],
                c,
                "ALL in declaration order"
            );
            if seen.last() != Some(&c.name()) {
                assert!(!seen.contains(&c.name()), "{} not adjacent", c.name());
                seen.push(c.name());
            }
        }
        for cause in ["unknown_ca", "name_mismatch", "expired", "other"] {
            let c = UpstreamCounter::tls_failure(cause);
            assert_eq!(c.label(), Some(("cause", cause)));
        }
        assert_eq!(
            UpstreamCounter::tls_failure("bad_mac"),
            UpstreamCounter::TlsFailOther
        );
    }

    #[test]
    fn a_tally_keeps_its_row_and_start() {
        let last = AnswerRow((MAX_ANSWER_ROWS - 1) as u16);
        let mut t = Tally::new(last, START_MASK);
        assert_eq!((t.row(), t.start_us()), (last, START_MASK));
        t.set_row(AnswerRow(5));
        assert_eq!((t.row(), t.start_us()), (AnswerRow(5), START_MASK));
        assert_eq!(Tally::starting(42).row(), AnswerRow::NONE);
        assert_eq!(std::mem::size_of::<Tally>(), 8);
    }

    #[test]
    fn odd_statuses_fall_into_the_nearest_class() {
        let stats = Stats::new(1);
        stats.worker(0).answered(99, Tally::starting(0), 0);
        stats.worker(0).answered(600, Tally::starting(0), 0);
        let s = stats.snapshot();
        assert_eq!(s.answers[0].responses, [1, 0, 0, 0, 1]);
    }

    #[test]
    fn site_rows_are_bounded_and_the_rest_share_one() {
        let stats = Stats::new(1);
        let rows: Vec<AnswerRow> = (0..MAX_SITES + 10)
            .map(|i| stats.site(&format!("site{i}")))
            .collect();
        let other = AnswerRow((MAX_SITES - 1) as u16);
        assert_eq!(rows[MAX_SITES - 3], AnswerRow((MAX_SITES - 2) as u16));
        assert!(rows[MAX_SITES - 2..].iter().all(|&s| s == other));
        stats.worker(0).answered(200, Tally::new(other, 0), 0);
        // A route of a site past the bound is the shared site's.
        let route = stats.route(rows[MAX_SITES + 5], "/");
        let s = stats.snapshot();
        assert_eq!(s.answers.len(), MAX_SITES + 1);
        assert_eq!(s.answers[MAX_SITES - 1].site, OTHER);
        assert_eq!(s.answers[MAX_SITES - 1].responses[1], 1);
        assert_eq!(s.answers[MAX_SITES].route, "/");
        assert_eq!(s.answers[MAX_SITES].site, OTHER);
        assert_eq!(route, AnswerRow(MAX_SITES as u16));
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
        let route = stats.route(site, "/");
        let group = stats.upstream("blog /");
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
            worker.answered(status, Tally::new(route, i), i * 3);
            worker.bump_upstream(group, UpstreamCounter::Reuses);
        }
        let allocations = counting::ALLOCATIONS.with(|c| c.replace(None));
        assert_eq!(allocations, Some(0));
        assert_eq!(
            stats
                .snapshot()
                .answers_of("blog", "/")
                .unwrap()
                .buckets
                .iter()
                .sum::<u64>(),
            10_000
        );
    }

    #[test]
    fn worker_blocks_do_not_share_cache_lines() {
        assert!(std::mem::align_of::<WorkerStats>() >= 128);
        assert_eq!(std::mem::size_of::<WorkerStats>() % 128, 0);
    }
}
