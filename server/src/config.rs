//! What a server is told at start-up (and, for some of it, on reload): its listeners and
//! the limits and timeouts its connections keep.

use std::time::Duration;

use tern_codec::Limits;
use tern_runtime::RuntimeConfig;

/// What a listener serves (by its index in `RuntimeConfig::listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerKind {
    /// Plain HTTP.
    Http,
    /// HTTP over TLS (needs [`Server::with_tls`]).
    Https,
    /// Plain HTTP that answers every request with a redirect to the same path on the first
    /// `Https` listener ([`ServerConfig::redirect_http`]: 308 to the same host by default).
    RedirectToHttps,
}

/// What a redirect listener answers: the status, and the host each request goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectHttp {
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
    /// `(host, target)`: a request for `host` (lower case, no port, no trailing dot) goes to
    /// `target` (a host name, maybe with its port: then the https port is not added).
    pub hosts: Vec<(String, String)>,
    /// Where every other request goes; `None`: its own host.
    pub any: Option<String>,
}

impl Default for RedirectHttp {
    fn default() -> Self {
        RedirectHttp {
            status: 308,
            hosts: Vec::new(),
            any: None,
        }
    }
}

impl RedirectHttp {
    /// The target host a request for `name` goes to, if one is set.
    pub fn target_for(&self, name: &str) -> Option<&str> {
        let name = name.strip_suffix('.').unwrap_or(name);
        self.hosts
            .iter()
            .find(|(host, _)| host.eq_ignore_ascii_case(name))
            .map(|(_, target)| target.as_str())
            .or(self.any.as_deref())
    }
}

/// Everything a server needs to know at start-up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub runtime: RuntimeConfig,
    pub limits: Limits,
    /// From the first byte of a request head to its end.
    pub header_timeout: Duration,
    /// Between progress while reading a request body.
    pub body_timeout: Duration,
    /// An idle keep-alive connection is closed after this.
    pub idle_timeout: Duration,
    /// A client that accepts none of our output for this long is dropped.
    pub write_timeout: Duration,
    /// Open connections per worker; above it new ones are closed at once.
    pub max_connections_per_worker: usize,
    /// What each address of `runtime.listen` serves; missing entries are plain HTTP.
    pub listener_kinds: Vec<ListenerKind>,
    /// `Strict-Transport-Security: max-age=N` on answers over TLS.
    pub hsts_max_age: Option<u64>,
    /// What the `RedirectToHttps` listeners answer.
    pub redirect_http: RedirectHttp,
    /// Offer WebSocket over HTTP/2 (RFC 8441 extended CONNECT): advertised in SETTINGS, and
    /// relayed by proxy routes to their upstream as an HTTP/1.1 WebSocket handshake.
    pub http2_websocket: bool,
    /// Serve HTTP/3 (QUIC) on the UDP port of every TLS listener, advertised to TCP clients
    /// with `Alt-Svc`.
    pub http3: bool,
    /// Test hook (tern's HTTP/3 tests, `--test-quic-retry`): every QUIC client whose address
    /// is not yet validated gets a Retry before its handshake, as new clients do above 256
    /// handshakes in progress on a worker.
    pub quic_retry_always: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            runtime: RuntimeConfig::default(),
            limits: Limits::default(),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            max_connections_per_worker: 16_384,
            listener_kinds: Vec::new(),
            hsts_max_age: None,
            redirect_http: RedirectHttp::default(),
            http2_websocket: false,
            http3: false,
            quic_retry_always: false,
        }
    }
}
