//! The counter catalogue: every counter a worker keeps, each with its metric name, the label
//! that tells it from the others of that name, and the name's help line, written once in a
//! table (`counters!`) from which the enums and their lookups are made.

use tern_codec::RequestError;

/// Declares a catalogue of counters from one table. Counters are grouped by metric name, each
/// group under the name's one help line; the counters of a group tell themselves apart by a
/// label (`Variant(key = "value")`). Made from it: the enum (variants in table order, so
/// `c as usize` indexes a worker's array), `ALL` in the same order (the series of one name
/// adjacent, as the Prometheus page needs), and `name()`, `label()` and `help()`.
macro_rules! counters {
    (
        $(#[$enum_meta:meta])*
        pub enum $Enum:ident {
            $(
                $name:literal => $help:literal {
                    $( $(#[$meta:meta])* $Variant:ident $(($key:ident = $value:literal))? ),+ $(,)?
                }
            )+
        }
    ) => {
        $(#[$enum_meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum $Enum {
            $( $( $(#[$meta])* $Variant, )+ )+
        }

        impl $Enum {
            /// Every counter, in the table's order: counters of one name are adjacent.
            pub const ALL: [$Enum; [$( $( stringify!($Variant), )+ )+].len()] =
                [$( $( $Enum::$Variant, )+ )+];

            /// The metric's name: several counters share one, told apart by their
            /// [`label`](Self::label) (a cause, a kind of timeout). Prometheus's page adds
            /// `_total`.
            pub fn name(self) -> &'static str {
                match self {
                    $( $( $Enum::$Variant )|+ => $name, )+
                }
            }

            /// The label that tells this counter from the others of its name.
            pub fn label(self) -> Option<(&'static str, &'static str)> {
                match self {
                    $( $( $Enum::$Variant => counters!(@label $($key = $value)?), )+ )+
                }
            }

            /// The help line of the counter's name (the same for every label).
            pub fn help(self) -> &'static str {
                match self {
                    $( $( $Enum::$Variant )|+ => $help, )+
                }
            }
        }
    };
    (@label) => {
        None
    };
    (@label $key:ident = $value:literal) => {
        Some((stringify!($key), $value))
    };
}

counters! {
    /// Every counter a worker keeps besides the answers (counted per site and route,
    /// [`AnswerRow`](crate::AnswerRow)) and the upstream exchanges (per group,
    /// [`UpstreamCounter`]).
    pub enum Counter {
        "connections_accepted" => "TCP connections accepted" {
            ConnectionsAccepted,
        }
        "connections_closed" => "TCP connections closed" {
            ConnectionsClosed,
        }
        "connections_refused" => "connections closed at once at the connection limit" {
            /// Accepted and closed at once because the worker was at its connection limit.
            ConnectionsRefused,
        }
        "connections_dropped" => "connections closed without an answer by a handler" {
            /// Closed without an answer by a handler (`Reply::Drop`), e.g. far over a rate
            /// limit.
            ConnectionsDropped,
        }
        "requests" => "requests whose head was parsed" {
            Requests,
        }
        "timeouts" => "connections closed by a timeout: slow request head or body, idle \
                       keep-alive, a client that stopped reading (write)" {
            TimeoutHeader(kind = "header"),
            TimeoutBody(kind = "body"),
            TimeoutIdle(kind = "idle"),
            TimeoutWrite(kind = "write"),
        }
        "panics" => "panics, by where they were contained: a handler (answered 500), a \
                     connection's code (that connection closed), none (a worker lost; tern \
                     exits)" {
            /// Panics, by where they were contained (`tern_panics_total{where}`): in a handler
            /// (answered 500), in a connection's own code (that connection closed), or nowhere
            /// (the worker was lost; tern then stops and exits with an error, see
            /// `runtime/src/worker.rs`).
            HandlerPanics(where = "handler"),
            ConnectionPanics(where = "connection"),
            WorkerPanics(where = "worker"),
        }
        "io_errors" => "socket read/write errors" {
            /// Read or write errors from the socket (resets, broken pipes).
            IoErrors,
        }
        "tls_handshakes" => "TLS handshakes completed" {
            /// TLS handshakes completed.
            TlsHandshakes,
        }
        "tls_handshake_failures" => "TLS sessions that failed, by cause" {
            /// Plain HTTP sent to a TLS port (answered 400 in plain HTTP).
            TlsFailedPlainHttp(cause = "plain_http"),
            /// Handshakes not completed within the header timeout.
            TlsFailedTimeout(cause = "timeout"),
            /// Garbage, truncated or unexpected records, bad MACs, protocol violations.
            TlsFailedBadRecord(cause = "bad_record"),
            /// No protocol version, cipher suite, group or signature scheme in common.
            TlsFailedNoSharedParams(cause = "no_shared_params"),
            /// The client sent a fatal alert (e.g. it does not trust the certificate).
            TlsFailedPeerAlert(cause = "peer_alert"),
            /// The client closed the connection in the middle of the handshake.
            TlsFailedClosed(cause = "closed"),
            TlsFailedOther(cause = "other"),
        }
        "http2_connections" => "connections that spoke HTTP/2" {
            /// Connections that spoke HTTP/2 (ALPN h2, or the preface on a plain port).
            Http2Connections,
        }
        "http2_stream_errors" => "HTTP/2 streams reset for a peer's protocol error" {
            /// HTTP/2 streams we reset for the peer's fault (malformed fields, flow control,
            /// ...).
            Http2StreamErrors,
        }
        "http2_connection_errors" => "HTTP/2 connections closed for a protocol error" {
            /// HTTP/2 connections closed with a GOAWAY error for the peer's fault.
            Http2ConnectionErrors,
        }
        "http2_floods" => "HTTP/2 connections closed for rapid reset or control-frame floods" {
            /// HTTP/2 connections closed with ENHANCE_YOUR_CALM (rapid reset, floods).
            Http2Floods,
        }
        "connections_banned" => "connections from banned peers closed at accept" {
            /// Closed at accept, before any read, because the peer is banned (`bans.rs`).
            ConnectionsBanned,
        }
        "bans_added" => "peers banned (slow request heads, or dropped by a handler)" {
            /// Bans added (slowloris strikes, or a handler's `Reply::Drop`).
            BansAdded,
        }
        "ban_nft_failures" => "bans the nftables set did not get (queue full, nft error)" {
            /// Bans the nftables set (`--ban-nft-set`) did not get: its queue was full, or nft
            /// failed or was gone.
            BanNftFailures,
        }
        "access_log_lines" => "access-log lines written" {
            /// Access-log lines written to the file.
            AccessLogLines,
        }
        "access_log_lines_dropped" => "access-log lines dropped (writer behind, or the write \
                                       failed)" {
            /// Access-log lines lost: the writer fell behind (the queue was full), or the
            /// write failed (a full disk).
            AccessLogLinesDropped,
        }
        "websocket_tunnels_opened" => "WebSocket tunnels opened to upstreams, by the client's \
                                       protocol: an HTTP/1.1 upgrade (http1) or an HTTP/2 \
                                       extended CONNECT (http2)" {
            /// WebSocket tunnels through the reverse proxy (an upstream's `101`), by the
            /// client's protocol: an HTTP/1.1 upgrade or an HTTP/2 extended CONNECT (RFC 8441).
            WebsocketTunnelsOpenedHttp1(protocol = "http1"),
            WebsocketTunnelsOpenedHttp2(protocol = "http2"),
        }
        "websocket_tunnels_closed" => "WebSocket tunnels to upstreams that ended" {
            /// WebSocket tunnels that ended (both protocols).
            WebsocketTunnelsClosed,
        }
        "compressed_answers" => "answers compressed on the fly, by coding" {
            /// Answers compressed on the fly, by coding (`Counter::compressed`).
            CompressedGzip(encoding = "gzip"),
            CompressedBr(encoding = "br"),
            CompressedZstd(encoding = "zstd"),
        }
        "compression_bytes_in" => "body bytes of answers compressed on the fly, before \
                                   compression" {
            /// Body bytes those answers had before compression, by coding.
            CompressInGzip(encoding = "gzip"),
            CompressInBr(encoding = "br"),
            CompressInZstd(encoding = "zstd"),
        }
        "compression_bytes_out" => "body bytes of answers compressed on the fly, after \
                                    compression" {
            /// Bytes they had after, by coding.
            CompressOutGzip(encoding = "gzip"),
            CompressOutBr(encoding = "br"),
            CompressOutZstd(encoding = "zstd"),
        }
        "rate_limited" => "requests a route's rate_limit refused with 429" {
            /// Requests a route's `rate_limit` refused (429).
            RateLimited,
        }
        "compression_failures" => "answers whose encoder failed (out of memory): cut short, \
                                   or sent as they are" {
            /// Answers whose encoder failed (out of memory): cut short, or sent uncompressed
            /// when nothing had gone out yet.
            CompressionFailures,
        }
        "compression_skipped" => "answers sent uncompressed that would have been compressed: \
                                  the encoder budget of the worker or of the connection was \
                                  spent" {
            /// Answers sent uncompressed because the encoder budget (the worker's, or the
            /// connection's) was spent.
            CompressionSkippedMemory(cause = "memory"),
        }
        // HTTP/3 (`quic/`): QUIC connections, their datagrams and their errors.
        "quic_connections" => "QUIC connections accepted (handshakes begun)" {
            QuicAccepted,
        }
        "quic_connections_closed" => "QUIC connections ended and forgotten" {
            QuicClosed,
        }
        "quic_connections_refused" => "QUIC handshakes refused before any state was kept" {
            /// The worker was at its connection limit, or draining (CONNECTION_REFUSED).
            QuicRefusedLimit(cause = "limit"),
            /// From a banned address (ignored: nothing is sent back).
            QuicRefusedBanned(cause = "banned"),
        }
        "quic_handshakes_failed" => "QUIC connections that ended before their handshake completed" {
            QuicHandshakesFailed,
        }
        "quic_retries" => "Retry packets sent to make a client prove its address (under load)" {
            QuicRetries,
        }
        "quic_datagrams" => "UDP datagrams of HTTP/3" {
            QuicDatagramsIn(direction = "in"),
            QuicDatagramsOut(direction = "out"),
        }
        "quic_bytes" => "UDP payload bytes of HTTP/3" {
            QuicBytesIn(direction = "in"),
            QuicBytesOut(direction = "out"),
        }
        "quic_send_errors" => "HTTP/3 datagrams not sent (a socket error, or its queue full)" {
            QuicSendErrors,
        }
        "quic_datagrams_handed_off" => "HTTP/3 datagrams sent on to the worker whose connection \
                                        they name (the client's address or port changed)" {
            QuicDatagramsHandedOff,
        }
        "quic_handoffs_dropped" => "HTTP/3 datagrams for another worker's connection dropped: \
                                    too many waited for that worker already" {
            QuicHandoffsDropped,
        }
        "quic_lost_packets" => "QUIC packets declared lost, of connections that ended" {
            QuicLostPackets,
        }
        "quic_panics" => "panics in QUIC code contained to their connection or datagram" {
            QuicPanics,
        }
        "http3_connections" => "QUIC connections whose handshake completed (HTTP/3)" {
            Http3Connections,
        }
        "http3_stream_errors" => "HTTP/3 request streams reset for the peer's protocol error" {
            Http3StreamErrors,
        }
        "http3_connection_errors" => "HTTP/3 connections closed for the peer's protocol error" {
            Http3ConnectionErrors,
        }
        "http3_too_early" => "HTTP/3 requests in 0-RTT early data answered 425 (not safe to \
                              answer before the handshake)" {
            Http3TooEarly,
        }
        "quic_early_data_accepted" => "QUIC connections whose 0-RTT early data was accepted" {
            QuicEarlyDataAccepted,
        }
        // The io_uring backend's work (`--io uring`).
        "io_uring_submissions" => "operations queued on the workers' io_uring rings" {
            IoUringSubmissions,
        }
        "io_uring_completions" => "completions taken from the workers' io_uring rings" {
            IoUringCompletions,
        }
        "io_uring_enters" => "io_uring_enter calls (one per event-loop turn, more when a \
                              queue fills)" {
            IoUringEnters,
        }
        "io_uring_rearms" => "multishot receives started again after they ended" {
            IoUringRearms,
        }
        "io_uring_buffer_exhaustions" => "receives that found the io_uring provided-buffer \
                                          ring empty" {
            IoUringBufferExhaustions,
        }
        "io_uring_buffers_reclaimed" => "io_uring receive buffers given back while the ring \
                                         was dry, their unread bytes copied out" {
            IoUringBuffersReclaimed,
        }
    }
}

impl Counter {
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
}

counters! {
    /// The reverse proxy's counters, kept per upstream group
    /// ([`UpstreamRow`](crate::UpstreamRow)): a group's figures are what its route's upstreams
    /// did. The pages show them by `upstream` label, and `/statusz` also the process's totals.
    pub enum UpstreamCounter {
        "upstream_connects" => "new connections to upstream servers, by upstream group" {
            /// New connections to upstream servers.
            Connects,
        }
        "upstream_reuses" => "requests sent on a pooled upstream connection, by upstream group" {
            /// Requests sent on a pooled upstream connection.
            Reuses,
        }
        "upstream_connect_failures" => "upstream connections that could not be made, by \
                                        upstream group" {
            /// Upstream connections that could not be made (refused, unreachable, timed out).
            ConnectFailures,
        }
        "upstream_failures" => "upstream exchanges that failed (502, 504, cut short), by \
                                upstream group" {
            /// Upstream exchanges that failed: no answer, a malformed or cut-short answer,
            /// 502/504.
            Failures,
        }
        "upstream_timeouts" => "upstream connect, first-byte or idle timeouts, by upstream \
                                group" {
            /// Upstream connect, first-byte or idle timeouts.
            Timeouts,
        }
        "upstream_retries" => "requests sent again, by upstream group: on a new connection \
                               after a dead pooled one (stale_connection), to the next server \
                               after a connect failure (connect) or a 502/503/504 answer \
                               (status)" {
            /// Idempotent requests sent again after a pooled connection turned out dead.
            RetriesStale(cause = "stale_connection"),
            /// Requests sent to the next server after a connect failure.
            RetriesConnect(cause = "connect"),
            /// Idempotent requests sent to the next server after a 502, 503 or 504 answer.
            RetriesStatus(cause = "status"),
        }
        "upstream_tls_handshakes" => "TLS handshakes with upstream servers, by upstream group" {
            /// TLS handshakes with upstream servers that succeeded.
            TlsHandshakes,
        }
        "upstream_tls_failures" => "failed TLS handshakes with upstream servers, by upstream \
                                    group and cause (a certificate from an unknown CA, for \
                                    another name, expired; other)" {
            /// TLS handshakes with upstream servers that failed, by cause
            /// ([`UpstreamCounter::tls_failure`]).
            TlsFailUnknownCa(cause = "unknown_ca"),
            TlsFailNameMismatch(cause = "name_mismatch"),
            TlsFailExpired(cause = "expired"),
            TlsFailOther(cause = "other"),
        }
    }
}

impl UpstreamCounter {
    /// The failure counter for a cause named by `tern_tls::upstream::failure_cause`.
    pub fn tls_failure(cause: &str) -> UpstreamCounter {
        match cause {
            "unknown_ca" => UpstreamCounter::TlsFailUnknownCa,
            "name_mismatch" => UpstreamCounter::TlsFailNameMismatch,
            "expired" => UpstreamCounter::TlsFailExpired,
            _ => UpstreamCounter::TlsFailOther,
        }
    }
}

/// The lengths of a worker's arrays of counters: the catalogue's, bad requests by cause, and
/// an upstream group's row.
pub(super) const N_COUNTERS: usize = Counter::ALL.len();
pub(super) const N_BAD: usize = RequestError::ALL.len();
pub(super) const N_UPSTREAM: usize = UpstreamCounter::ALL.len();

#[cfg(test)]
mod tests {
    use super::*;

    /// The pages need the series of one name together, and arrays are indexed by `c as usize`.
    fn adjacent_names_in_declaration_order<C: Copy + PartialEq + std::fmt::Debug>(
        all: &[C],
        index: impl Fn(C) -> usize,
        name: impl Fn(C) -> &'static str,
    ) {
        let mut seen: Vec<&str> = Vec::new();
        for (i, &c) in all.iter().enumerate() {
            assert_eq!(index(c), i, "{c:?}: ALL in declaration order");
            if seen.last() != Some(&name(c)) {
                assert!(!seen.contains(&name(c)), "{} not adjacent", name(c));
                seen.push(name(c));
            }
        }
    }

    #[test]
    fn counters_of_one_name_are_adjacent_and_in_declaration_order() {
        adjacent_names_in_declaration_order(&Counter::ALL, |c| c as usize, Counter::name);
        adjacent_names_in_declaration_order(
            &UpstreamCounter::ALL,
            |c| c as usize,
            UpstreamCounter::name,
        );
    }

    #[test]
    fn counters_sharing_a_name_have_distinct_labels_of_one_key() {
        for c in Counter::ALL {
            let same: Vec<Counter> = Counter::ALL
                .into_iter()
                .filter(|o| o.name() == c.name())
                .collect();
            if same.len() == 1 {
                continue;
            }
            let (key, value) = c.label().expect("a shared name needs a label");
            for o in same.into_iter().filter(|&o| o != c) {
                let (other_key, other_value) = o.label().expect("labelled");
                assert_eq!(key, other_key, "{c:?} and {o:?}");
                assert_ne!(value, other_value, "{c:?} and {o:?}");
            }
        }
    }

    #[test]
    fn upstream_tls_failures_have_their_causes_as_labels() {
        for cause in ["unknown_ca", "name_mismatch", "expired", "other"] {
            let c = UpstreamCounter::tls_failure(cause);
            assert_eq!(c.label(), Some(("cause", cause)));
        }
        assert_eq!(
            UpstreamCounter::tls_failure("bad_mac"),
            UpstreamCounter::TlsFailOther
        );
    }
}
