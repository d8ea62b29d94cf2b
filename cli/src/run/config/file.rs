//! The file's schema, as serde reads it: the top level ([`RunFile`]), `[[site]]`
//! ([`SiteFile`]) and `[[site.route]]` ([`RouteFile`], flat: every kind's keys side by side,
//! each kind's checks in its own module say which keys it takes). Unknown keys are refused
//! here, with their line.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use crate::common::LogFormatArg;

crate::config::server_keys! {
    file
    /// The keys of the file; everything but `[[site]]` is optional. The server keys come first
    /// (listed in `crate::config`, shared with `tern serve --config`).
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct RunFile {
        /// The auth gateway's config (`tern gate`'s file); routes with `gate = true` are behind it.
        pub(super) gate: Option<Spanned<PathBuf>>,
        /// WebSocket over HTTP/2 (RFC 8441's extended CONNECT) offered in the SETTINGS; default:
        /// when some route is a proxy.
        pub(super) http2_websocket: Option<bool>,
        /// Shared caches by name (`[cache.NAME]`: sizes), for routes with `cache`.
        pub(super) cache: Option<super::cache::CacheBlocks>,
        /// The control socket (`tern reload` and `tern cache purge`, `--control PATH`),
        /// relative to the file's folder; made at start, before privileges are dropped.
        /// Restart only.
        pub(super) control: Option<Spanned<PathBuf>>,
        /// The group given the control socket (mode 0660): its members may reload and purge.
        /// Looked up at start-up. Restart only.
        pub(super) control_group: Option<Spanned<String>>,
        #[serde(default)]
        pub(super) site: Vec<SiteFile>,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SiteFile {
    pub(super) name: Spanned<String>,
    #[serde(default)]
    pub(super) hosts: Vec<Spanned<String>>,
    pub(super) default: Option<Spanned<bool>>,
    /// A file of the site's own, or "off".
    pub(super) access_log: Option<Spanned<String>>,
    pub(super) access_log_format: Option<Spanned<LogFormatArg>>,
    /// Pages for the error statuses tern answers itself: `{ 404 = "errors/404.html" }`.
    pub(super) error_pages: Option<Spanned<BTreeMap<String, Spanned<PathBuf>>>>,
    /// Every request gets an id (`X-Request-Id` to apps, `$request_id`, the access log).
    pub(super) request_id: Option<Spanned<bool>>,
    /// Peers whose own `X-Request-Id` is kept.
    pub(super) request_id_trusted: Option<Spanned<String>>,
    /// On-the-fly compression, the default of the site's routes (see [`CompressKeys`]).
    pub(super) compress: Option<Spanned<Codings>>,
    pub(super) compress_min_size: Option<Spanned<u64>>,
    pub(super) compress_types: Option<Spanned<Vec<String>>>,
    pub(super) compress_level: Option<Spanned<BTreeMap<String, u32>>>,
    /// Header edits on every answer of the site (its routes' own go over them).
    pub(super) add_headers: Option<Spanned<BTreeMap<String, String>>>,
    pub(super) remove_headers: Option<Spanned<Vec<String>>>,
    pub(super) headers_by_type: Option<Spanned<HeadersByType>>,
    pub(super) expires: Option<Spanned<ExpiresByType>>,
    #[serde(default)]
    pub(super) route: Vec<RouteFile>,
}

/// `{ "text/html" = { "Content-Security-Policy" = "default-src 'self'" } }`.
pub(super) type HeadersByType = BTreeMap<String, BTreeMap<String, String>>;
/// `{ "text/html" = "epoch", "image/*" = "30d", "*" = "off" }` (a number: seconds).
pub(super) type ExpiresByType = BTreeMap<String, ExpiresValue>;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ExpiresValue {
    Secs(u64),
    Text(String),
}

/// One route: `path` and exactly one kind key (`static`, `redirect`, `respond`, `app`), the
/// keys of that kind, and header edits.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteFile {
    pub(super) path: Spanned<String>,
    /// What /metrics calls the route (its `route` label); default: `path` as written.
    pub(super) name: Option<Spanned<String>>,
    #[serde(rename = "static")]
    pub(super) static_root: Option<Spanned<PathBuf>>,
    pub(super) serve_dotfiles: Option<Spanned<bool>>,
    pub(super) cache_control: Option<Spanned<String>>,
    pub(super) max_cached_size: Option<Spanned<u64>>,
    pub(super) redirect: Option<Spanned<String>>,
    pub(super) keep_path: Option<Spanned<bool>>,
    pub(super) respond: Option<Spanned<String>>,
    pub(super) content_type: Option<Spanned<String>>,
    pub(super) status: Option<Spanned<u16>>,
    pub(super) app: Option<Spanned<String>>,
    pub(super) data: Option<Spanned<PathBuf>>,
    /// The app's claims in PostgreSQL instead of `data` (`postgres://…`).
    pub(super) store: Option<Spanned<String>>,
    pub(super) pages: Option<Spanned<PathBuf>>,
    /// One upstream or a list: `host:port`, `[v6]:port` or `unix:/path`, each maybe followed
    /// by `weight=N` and `backup`.
    pub(super) proxy: Option<Spanned<Servers>>,
    /// A shared cache (`cache.rs`): true, or a `[cache.NAME]`'s name.
    pub(super) cache: Option<Spanned<super::cache::CacheChoice>>,
    pub(super) cache_key_query: Option<Spanned<super::cache::KeyQueryFile>>,
    pub(super) cache_key_headers: Option<Spanned<Vec<String>>>,
    pub(super) cache_valid: Option<Spanned<BTreeMap<String, String>>>,
    pub(super) cache_bypass_cookies: Option<Spanned<Vec<String>>>,
    pub(super) cache_ignore_cookies: Option<Spanned<Vec<String>>>,
    pub(super) cache_authorized: Option<Spanned<bool>>,
    pub(super) cache_status: Option<Spanned<bool>>,
    /// `cache_valid` replaces the answers' own `Cache-Control` and `Expires`.
    pub(super) cache_override: Option<Spanned<bool>>,
    /// With `static`: `*.php` scripts under the root run on these FastCGI servers (PHP-FPM).
    pub(super) fastcgi: Option<Spanned<Servers>>,
    /// What a folder's path runs: file names in order, and last maybe the front controller
    /// (`["index.php", "index.html", "/index.php$uri"]`; default `index.php`).
    pub(super) index: Option<Spanned<Names>>,
    /// CGI parameters set or overridden (nginx's `fastcgi_param`).
    pub(super) fastcgi_params: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    pub(super) balance: Option<Spanned<String>>,
    pub(super) proxy_host: Option<Spanned<String>>,
    /// TLS to `https://` upstreams: the name their certificates must carry (and SNI), for
    /// every server of the route; default: each server's host.
    pub(super) proxy_tls_server_name: Option<Spanned<String>>,
    /// A PEM file of the CAs to trust instead of the system's.
    pub(super) proxy_tls_ca: Option<Spanned<String>>,
    /// A client certificate (PEM chain) and key for upstreams that ask for one.
    pub(super) proxy_tls_client_cert: Option<Spanned<String>>,
    pub(super) proxy_tls_client_key: Option<Spanned<String>>,
    pub(super) max_fails: Option<Spanned<u32>>,
    pub(super) fail_timeout: Option<Spanned<u64>>,
    pub(super) connect_timeout: Option<Spanned<u64>>,
    pub(super) first_byte_timeout: Option<Spanned<u64>>,
    pub(super) upstream_idle_timeout: Option<Spanned<u64>>,
    pub(super) keepalive: Option<Spanned<usize>>,
    /// Servers a request may go on to after its first (connect failures, retried statuses).
    pub(super) retries: Option<Spanned<u32>>,
    /// Seconds after the first try past which no other server is tried.
    pub(super) retry_budget: Option<Spanned<u64>>,
    /// Answers (502, 503, 504) that send an idempotent request to the next server.
    pub(super) retry_on_status: Option<Spanned<Vec<u16>>>,
    /// Active health checks of the upstreams.
    pub(super) health_check: Option<Spanned<HealthCheckFile>>,
    pub(super) trusted_proxies: Option<Spanned<String>>,
    /// The server's counters: "statusz" (name: value lines) or "metrics" (Prometheus).
    pub(super) counters: Option<Spanned<String>>,
    pub(super) add_headers: Option<Spanned<BTreeMap<String, String>>>,
    pub(super) remove_headers: Option<Spanned<Vec<String>>>,
    pub(super) headers_by_type: Option<Spanned<HeadersByType>>,
    pub(super) expires: Option<Spanned<ExpiresByType>>,
    /// Fields set on or removed from the request a proxied app gets.
    pub(super) add_request_headers: Option<Spanned<BTreeMap<String, String>>>,
    pub(super) remove_request_headers: Option<Spanned<Vec<String>>>,
    pub(super) gate: Option<Spanned<bool>>,
    // Matchers beyond the path prefix.
    pub(super) methods: Option<Spanned<Vec<String>>>,
    pub(super) match_headers: Option<Spanned<BTreeMap<String, String>>>,
    pub(super) match_query: Option<Spanned<BTreeMap<String, String>>>,
    /// Anchored patterns on header fields (`{ "User-Agent" = '^DavClnt.*$' }`).
    pub(super) match_headers_regex: Option<Spanned<BTreeMap<String, String>>>,
    pub(super) path_glob: Option<Spanned<String>>,
    pub(super) path_regex: Option<Spanned<String>>,
    /// An internal rewrite (a route kind): routed again with this path.
    pub(super) rewrite: Option<Spanned<String>>,
    pub(super) try_files: Option<Spanned<Vec<String>>>,
    pub(super) strip_prefix: Option<Spanned<bool>>,
    /// Paths with `%2F` taken (kept opaque inside their segment) rather than refused.
    pub(super) allow_encoded_slash: Option<Spanned<bool>>,
    /// Only for requests tern routes again itself (rewrites, fallbacks, an app's hand-back):
    /// a client's own request gets 404 (nginx's `internal`).
    pub(super) internal: Option<Spanned<bool>>,
    /// Proxy and PHP routes: the app's `X-Accel-Redirect: /path` is answered by that path of
    /// the site.
    pub(super) x_accel_redirect: Option<Spanned<bool>>,
    /// Proxy and PHP routes: the app's answers with these statuses are answered by a path of
    /// the site instead (`{ 404 = "/fallback", 502 = "/down.html" }`).
    pub(super) reroute_status: Option<Spanned<BTreeMap<String, String>>>,
    pub(super) max_body: Option<Spanned<u64>>,
    pub(super) rate_limit: Option<Spanned<RateLimitFile>>,
    /// On-the-fly compression; each key not given is the site's.
    pub(super) compress: Option<Spanned<Codings>>,
    pub(super) compress_min_size: Option<Spanned<u64>>,
    pub(super) compress_types: Option<Spanned<Vec<String>>>,
    pub(super) compress_level: Option<Spanned<BTreeMap<String, u32>>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Codings {
    On(bool),
    List(Vec<String>),
}

/// `rate_limit = { per_second = 10, burst = 20 }`, by client network.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RateLimitFile {
    pub(super) per_second: u32,
    pub(super) burst: Option<u32>,
    /// Requests past the burst that wait their turn (let through at the rate) rather than
    /// being refused: nginx's `limit_req burst=` without `nodelay`.
    pub(super) queue: Option<u32>,
    pub(super) ipv4_prefix: Option<u8>,
    pub(super) ipv6_prefix: Option<u8>,
    /// Networks never limited (default: loopback; `""`: none).
    pub(super) exempt: Option<String>,
    /// Peers whose `X-Forwarded-For` names the client counted (default: the route's
    /// `trusted_proxies`).
    pub(super) trusted_proxies: Option<String>,
}

/// `health_check = { path = "/healthz", interval = 5, timeout = 2, status = "200-399",
/// rise = 2, fall = 3 }`; every key optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HealthCheckFile {
    pub(super) path: Option<String>,
    pub(super) interval: Option<u64>,
    pub(super) timeout: Option<u64>,
    pub(super) status: Option<String>,
    pub(super) rise: Option<u32>,
    pub(super) fall: Option<u32>,
}

/// `proxy = "127.0.0.1:8080"` or `proxy = ["a:1", "unix:/run/app.sock"]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Servers {
    One(String),
    Many(Vec<String>),
}

/// One name or a list of them (`index = "index.php"` or `["index.php", "index.html"]`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Names {
    One(String),
    Many(Vec<String>),
}

#[cfg(test)]
mod tests {
    use super::super::testing::problems;

    #[test]
    fn unknown_keys_and_bad_types_name_their_line() {
        assert_eq!(
            problems("[[site]]\nname = \"a\"\nhost = [\"x\"]\n"),
            [r#"line 3: unknown key "host""#]
        );
        let e = problems("[[site]]\nname = \"a\"\n[[site.route]]\npath = \"/\"\nstatic = \"site\"\nroot = \"x\"\n");
        assert_eq!(e, [r#"line 6: unknown key "root""#]);
        let e = problems("[[site]]\nname = \"a\"\n[[site.route]]\npath = \"/\"\nredirect = \"/x\"\nstatus = \"moved\"\n");
        assert!(e[0].starts_with("line 6: status: "), "{e:?}");
        let e = problems("workers = 1\nhttp2_websocket = \"off\"\n[[site]]\nname = \"a\"\n");
        assert!(e[0].starts_with("line 2: http2_websocket: "), "{e:?}");
    }
}
