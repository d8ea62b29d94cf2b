//! Forwarding an exchange to an upstream HTTP/1.1 server, on the worker that owns the client
//! connection: the handler API's half of it. A handler (the reverse proxy app) answers
//! [`Reply::Forward`](crate::Reply) with a [`Forward`]: the request head to send and the
//! [`Upstreams`] to choose a server from. The connection's protocol then relays the exchange
//! (`conn/relay/`: sans-IO, bodies streamed both ways with bounded buffers), and the driver
//! layer does the upstream socket's I/O beside the client's (`driver/relay.rs`), with
//! connections kept alive in a per-worker pool (`driver/pool.rs`): no lock and no other thread
//! on the way.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::response::Response;

/// Where an upstream server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UpstreamAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for UpstreamAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamAddr::Tcp(a) => write!(f, "{a}"),
            UpstreamAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// TLS toward one upstream server: the route's client configuration (`tern_tls::upstream`)
/// and the name the server's certificate must carry, sent as SNI.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    pub config: Arc<rustls::ClientConfig>,
    pub name: rustls::pki_types::ServerName<'static>,
}

/// The proxy's timeouts toward its upstreams.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamTimeouts {
    /// To establish a connection.
    pub connect: Duration,
    /// From the request's last byte sent to the response head's arrival.
    pub first_byte: Duration,
    /// Between reads once the response (or a WebSocket) is flowing, and between writes of
    /// the request body.
    pub idle: Duration,
    /// A pooled connection unused for this long is closed.
    pub keepalive: Duration,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        UpstreamTimeouts {
            connect: Duration::from_secs(5),
            first_byte: Duration::from_secs(60),
            idle: Duration::from_secs(60),
            keepalive: Duration::from_secs(30),
        }
    }
}

/// When a request goes on to another server of its group: after a connect failure always
/// (nothing of it reached a server), after a 502, 503 or 504 answer only when asked for and
/// only for an idempotent request whose whole body is still at hand. Either way within a
/// count of further servers and a time budget (nginx's `proxy_next_upstream_tries` and
/// `_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Servers a request may go on to after its first.
    pub retries: u32,
    /// No further server is tried once this long has passed since the first try started.
    pub budget: Option<Duration>,
    /// Bit i: a `502 + i` answer sends the request on (502, 503, 504).
    statuses: u8,
}

impl Default for RetryPolicy {
    /// Every server of the group once, after connect failures only, with no time limit.
    fn default() -> Self {
        RetryPolicy {
            retries: u32::MAX,
            budget: None,
            statuses: 0,
        }
    }
}

impl RetryPolicy {
    /// The answer statuses a request may be retried on.
    pub const STATUSES: [u16; 3] = [502, 503, 504];

    /// Also retried on a `status` answer; false (and nothing changes) for a status not in
    /// [`RetryPolicy::STATUSES`].
    pub fn retry_on(&mut self, status: u16) -> bool {
        match status {
            502..=504 => {
                self.statuses |= 1 << (status - 502);
                true
            }
            _ => false,
        }
    }

    pub fn retries_on(&self, status: u16) -> bool {
        matches!(status, 502..=504) && self.statuses & (1 << (status - 502)) != 0
    }

    /// Some answer status is retried on.
    pub fn retries_on_any(&self) -> bool {
        self.statuses != 0
    }
}

/// How an exchange with an upstream server ended, for its health and balancing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamOutcome {
    /// A complete response (or a WebSocket that ended).
    Ok,
    /// It could not be reached, timed out, or broke the response: counts against its health.
    Failed,
    /// Ended by the client or by us (client gone, shutdown): says nothing about the server.
    Abandoned,
}

/// Which row of the server's upstream counters an upstream group's exchanges are counted in
/// (`Stats::upstream` gives one per group name); [`Upstreams::counted_as`] says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UpstreamRow(pub(crate) u16);

impl UpstreamRow {
    /// Exchanges of no named group.
    pub const NONE: UpstreamRow = UpstreamRow(0);

    pub(crate) fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A group of upstream servers for one proxy route: which to use, and what happened. The
/// reverse proxy app implements it (balancing, passive health); the server calls it on the
/// worker thread, once per attempt: `pick`, then `begin` when a connection is attached,
/// `end` when it is released.
pub trait Upstreams: Send + Sync + 'static {
    /// Unique among the groups alive in this process: with the server index, it keys the
    /// per-worker pool of idle connections.
    fn pool_key(&self) -> u64;
    fn addr(&self, server: usize) -> &UpstreamAddr;
    /// A server for a request from `worker`, skipping those in the bitmask `tried` (bit i:
    /// server i already failed this request). None: none is available.
    fn pick(&self, worker: usize, now_ms: u64, tried: u64) -> Option<usize>;
    fn begin(&self, worker: usize, server: usize);
    fn end(&self, worker: usize, server: usize, outcome: UpstreamOutcome, now_ms: u64);
    fn timeouts(&self) -> UpstreamTimeouts;
    /// Idle connections kept per worker and server.
    fn max_idle(&self) -> usize;
    /// When a request goes on to another server.
    fn retry(&self) -> RetryPolicy {
        RetryPolicy::default()
    }
    /// TLS to `server`, if it is spoken (after connecting, before the request).
    fn tls(&self, _server: usize) -> Option<&UpstreamTls> {
        None
    }
    /// The row the group's connects, reuses, failures, timeouts and retries are counted in.
    fn counted_as(&self) -> UpstreamRow {
        UpstreamRow::NONE
    }
}

/// Edits a proxied response's head before it goes to the client (a route's header edits).
pub type ResponseEdit = Arc<dyn Fn(&mut Response) + Send + Sync>;

/// A request to relay to an upstream server, as a handler hands it over.
pub struct Forward {
    pub upstreams: Arc<dyn Upstreams>,
    /// The request line and header lines to send, each ending in CRLF, without the fields
    /// that frame the body (the relay adds Content-Length or Transfer-Encoding) and without
    /// the blank line.
    pub head: Vec<u8>,
    /// May be sent again after a pooled connection turned out dead (GET, HEAD, PUT,
    /// DELETE, OPTIONS, TRACE with no streamed body).
    pub idempotent: bool,
    /// The request asks for a protocol switch (WebSocket): a 101 turns the exchange into a
    /// tunnel both ways.
    pub upgrade: bool,
    pub edit: Option<ResponseEdit>,
    /// Applied to the answers tern makes itself for this exchange (502, 503, 504, 413): a
    /// site's error pages.
    pub own_answers: Option<ResponseEdit>,
    /// The most request body the relay passes on (a route's own limit); past it the
    /// exchange ends with 413. `u64::MAX`: no limit (the app has its own).
    pub max_body: u64,
    /// What the upstream speaks.
    pub wire: UpstreamWire,
    /// Not sent before this instant (the worker's clock, ms): a request a rate limit queued
    /// waits on the connection's timer, no worker held (0: at once).
    pub not_before_ms: u64,
    /// A copy of the answer for a shared cache's fill (`answer_tee.rs`); None: no copy.
    pub tee: Option<Box<dyn crate::answer_tee::AnswerTee>>,
    /// Held before it goes (a cache miss waiting for another request's fill), asked again
    /// at `not_before_ms` and at each instant it names (`answer_tee.rs`); None: not held.
    pub hold: Option<Box<dyn crate::answer_tee::Hold>>,
    /// Answers in place of the app's when the app fails (`answer_tee.rs`); None: the
    /// failure is the answer.
    pub fallback: Option<Box<dyn crate::answer_tee::Fallback>>,
}

/// A hand-off target (`X-Accel-Redirect`'s value, a `reroute_status` path; see
/// [`crate::Handback`]): `/path` with an
/// optional `?query`, the path in canonical form. Refused: no leading `/`, a path with no
/// canonical form (the codec's rules for request paths: no `%2F`, no `..` above the root...),
/// spaces, control bytes or `#` anywhere.
pub fn handoff_target(value: &[u8]) -> Result<(Cow<'_, str>, Option<&str>), &'static str> {
    let text = std::str::from_utf8(value).map_err(|_| "not UTF-8")?;
    if text
        .bytes()
        .any(|b| b.is_ascii_control() || b == b' ' || b == b'#')
    {
        return Err("spaces, control characters and # are not allowed");
    }
    let (path, query) = match text.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (text, None),
    };
    if !path.starts_with('/') {
        return Err("a path starting with / is needed");
    }
    let path = tern_codec::canonical_path(path).map_err(|_| "the path has no canonical form")?;
    Ok((path, query))
}

/// The protocol of an exchange with an upstream server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamWire {
    /// `head` is an HTTP/1.1 request line and fields.
    #[default]
    Http1,
    /// `head` is FastCGI's `BEGIN_REQUEST` and `PARAMS` records, the empty one that ends
    /// them included (request id `tern_fastcgi::REQUEST_ID`); the body goes as `STDIN`.
    FastCgi,
}

impl std::fmt::Debug for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forward")
            .field("head", &String::from_utf8_lossy(&self.head))
            .field("idempotent", &self.idempotent)
            .field("upgrade", &self.upgrade)
            .field("wire", &self.wire)
            .finish_non_exhaustive()
    }
}
