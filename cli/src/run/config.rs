//! The `tern run --config FILE` file: server settings, `[tls]` (as for `tern serve`), and
//! `[[site]]` entries with their `[[site.route]]`s. `examples/tern.toml` shows every key.
//!
//! Checking collects every problem it can find (not just the first), each as
//! `config FILE: line N: what`, so `tern run --check` lists them all. Only a TOML syntax or
//! type error stops early, since the rest of the file cannot be read past it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tern_server::static_files::StaticOptions;
use tern_vhost::HeaderEdits;
use toml::Spanned;

use crate::common::{CommonArgs, LogFormatArg};
use crate::config::{describe, line_of};
use crate::hardening::{FileHardening, SandboxArg};
use crate::tls::{FileTls, TlsArgs, TlsPlan};

/// The keys of the file; everything but `[[site]]` is optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunFile {
    listen: Option<SocketAddr>,
    workers: Option<Spanned<usize>>,
    pin: Option<bool>,
    header_timeout: Option<Spanned<u64>>,
    body_timeout: Option<Spanned<u64>>,
    idle_timeout: Option<Spanned<u64>>,
    write_timeout: Option<Spanned<u64>>,
    max_body: Option<u64>,
    max_connections: Option<Spanned<usize>>,
    shutdown_grace: Option<u64>,
    user: Option<String>,
    group: Option<String>,
    sandbox: Option<SandboxArg>,
    tls: Option<FileTls>,
    /// The auth gateway's config (`tern gate`'s file); routes with `gate = true` are behind it.
    gate: Option<Spanned<PathBuf>>,
    /// The access log of sites that name none of their own.
    access_log: Option<PathBuf>,
    access_log_format: Option<LogFormatArg>,
    /// WebSocket over HTTP/2 (RFC 8441's extended CONNECT) offered in the SETTINGS; default:
    /// when some route is a proxy.
    http2_websocket: Option<bool>,
    #[serde(default)]
    site: Vec<SiteFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SiteFile {
    name: Spanned<String>,
    #[serde(default)]
    hosts: Vec<Spanned<String>>,
    default: Option<Spanned<bool>>,
    /// A file of the site's own, or "off".
    access_log: Option<Spanned<String>>,
    access_log_format: Option<Spanned<LogFormatArg>>,
    /// Pages for the error statuses tern answers itself: `{ 404 = "errors/404.html" }`.
    error_pages: Option<Spanned<BTreeMap<String, Spanned<PathBuf>>>>,
    /// Every request gets an id (`X-Request-Id` to apps, `$request_id`, the access log).
    request_id: Option<Spanned<bool>>,
    /// Peers whose own `X-Request-Id` is kept.
    request_id_trusted: Option<Spanned<String>>,
    /// On-the-fly compression, the default of the site's routes (see [`CompressKeys`]).
    compress: Option<Spanned<Codings>>,
    compress_min_size: Option<Spanned<u64>>,
    compress_types: Option<Spanned<Vec<String>>>,
    compress_level: Option<Spanned<BTreeMap<String, u32>>>,
    /// Header edits on every answer of the site (its routes' own go over them).
    add_headers: Option<Spanned<BTreeMap<String, String>>>,
    remove_headers: Option<Spanned<Vec<String>>>,
    headers_by_type: Option<Spanned<HeadersByType>>,
    expires: Option<Spanned<ExpiresByType>>,
    #[serde(default)]
    route: Vec<RouteFile>,
}

/// `{ "text/html" = { "Content-Security-Policy" = "default-src 'self'" } }`.
type HeadersByType = BTreeMap<String, BTreeMap<String, String>>;
/// `{ "text/html" = "epoch", "image/*" = "30d", "*" = "off" }` (a number: seconds).
type ExpiresByType = BTreeMap<String, ExpiresValue>;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ExpiresValue {
    Secs(u64),
    Text(String),
}

/// One route: `path` and exactly one kind key (`static`, `redirect`, `respond`, `app`), the
/// keys of that kind, and header edits.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    path: Spanned<String>,
    /// What /metrics calls the route (its `route` label); default: `path` as written.
    name: Option<Spanned<String>>,
    #[serde(rename = "static")]
    static_root: Option<Spanned<PathBuf>>,
    serve_dotfiles: Option<Spanned<bool>>,
    cache_control: Option<Spanned<String>>,
    max_cached_size: Option<Spanned<u64>>,
    redirect: Option<Spanned<String>>,
    keep_path: Option<Spanned<bool>>,
    respond: Option<Spanned<String>>,
    content_type: Option<Spanned<String>>,
    status: Option<Spanned<u16>>,
    app: Option<Spanned<String>>,
    data: Option<Spanned<PathBuf>>,
    /// The app's claims in PostgreSQL instead of `data` (`postgres://…`).
    store: Option<Spanned<String>>,
    pages: Option<Spanned<PathBuf>>,
    /// One upstream or a list: `host:port`, `[v6]:port` or `unix:/path`, each maybe followed
    /// by `weight=N` and `backup`.
    proxy: Option<Spanned<Servers>>,
    /// With `static`: `*.php` scripts under the root run on these FastCGI servers (PHP-FPM).
    fastcgi: Option<Spanned<Servers>>,
    /// What a folder's path runs: file names in order, and last maybe the front controller
    /// (`["index.php", "index.html", "/index.php$uri"]`; default `index.php`).
    index: Option<Spanned<Names>>,
    /// CGI parameters set or overridden (nginx's `fastcgi_param`).
    fastcgi_params: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    balance: Option<Spanned<String>>,
    proxy_host: Option<Spanned<String>>,
    /// TLS to `https://` upstreams: the name their certificates must carry (and SNI), for
    /// every server of the route; default: each server's host.
    proxy_tls_server_name: Option<Spanned<String>>,
    /// A PEM file of the CAs to trust instead of the system's.
    proxy_tls_ca: Option<Spanned<String>>,
    /// A client certificate (PEM chain) and key for upstreams that ask for one.
    proxy_tls_client_cert: Option<Spanned<String>>,
    proxy_tls_client_key: Option<Spanned<String>>,
    max_fails: Option<Spanned<u32>>,
    fail_timeout: Option<Spanned<u64>>,
    connect_timeout: Option<Spanned<u64>>,
    first_byte_timeout: Option<Spanned<u64>>,
    upstream_idle_timeout: Option<Spanned<u64>>,
    keepalive: Option<Spanned<usize>>,
    /// Servers a request may go on to after its first (connect failures, retried statuses).
    retries: Option<Spanned<u32>>,
    /// Seconds after the first try past which no other server is tried.
    retry_budget: Option<Spanned<u64>>,
    /// Answers (502, 503, 504) that send an idempotent request to the next server.
    retry_on_status: Option<Spanned<Vec<u16>>>,
    /// Active health checks of the upstreams.
    health_check: Option<Spanned<HealthCheckFile>>,
    trusted_proxies: Option<Spanned<String>>,
    /// The server's counters: "statusz" (name: value lines) or "metrics" (Prometheus).
    counters: Option<Spanned<String>>,
    add_headers: Option<Spanned<BTreeMap<String, String>>>,
    remove_headers: Option<Spanned<Vec<String>>>,
    headers_by_type: Option<Spanned<HeadersByType>>,
    expires: Option<Spanned<ExpiresByType>>,
    /// Fields set on or removed from the request a proxied app gets.
    add_request_headers: Option<Spanned<BTreeMap<String, String>>>,
    remove_request_headers: Option<Spanned<Vec<String>>>,
    gate: Option<Spanned<bool>>,
    // Matchers beyond the path prefix.
    methods: Option<Spanned<Vec<String>>>,
    match_headers: Option<Spanned<BTreeMap<String, String>>>,
    match_query: Option<Spanned<BTreeMap<String, String>>>,
    /// Anchored patterns on header fields (`{ "User-Agent" = '^DavClnt.*$' }`).
    match_headers_regex: Option<Spanned<BTreeMap<String, String>>>,
    path_glob: Option<Spanned<String>>,
    path_regex: Option<Spanned<String>>,
    /// An internal rewrite (a route kind): routed again with this path.
    rewrite: Option<Spanned<String>>,
    try_files: Option<Spanned<Vec<String>>>,
    strip_prefix: Option<Spanned<bool>>,
    /// Paths with `%2F` taken (kept opaque inside their segment) rather than refused.
    allow_encoded_slash: Option<Spanned<bool>>,
    max_body: Option<Spanned<u64>>,
    rate_limit: Option<Spanned<RateLimitFile>>,
    /// On-the-fly compression; each key not given is the site's.
    compress: Option<Spanned<Codings>>,
    compress_min_size: Option<Spanned<u64>>,
    compress_types: Option<Spanned<Vec<String>>>,
    compress_level: Option<Spanned<BTreeMap<String, u32>>>,
}

/// One level's compression keys (a site's or a route's): `compress = ["zstd", "br",
/// "gzip"]` (the server's preference; `true`: that list, `false`: off),
/// `compress_min_size = 512`, `compress_types = ["text/*", ...]`, `compress_level =
/// { gzip = 6, br = 5, zstd = 3 }`.
#[derive(Clone, Copy, Default)]
struct CompressKeys<'a> {
    compress: Option<&'a Spanned<Codings>>,
    compress_min_size: Option<&'a Spanned<u64>>,
    compress_types: Option<&'a Spanned<Vec<String>>>,
    compress_level: Option<&'a Spanned<BTreeMap<String, u32>>>,
}

impl SiteFile {
    fn compress_keys(&self) -> CompressKeys<'_> {
        CompressKeys {
            compress: self.compress.as_ref(),
            compress_min_size: self.compress_min_size.as_ref(),
            compress_types: self.compress_types.as_ref(),
            compress_level: self.compress_level.as_ref(),
        }
    }
}

/// One level's header keys (a site's or a route's).
struct HeaderKeys<'a> {
    add_headers: &'a Option<Spanned<BTreeMap<String, String>>>,
    remove_headers: &'a Option<Spanned<Vec<String>>>,
    headers_by_type: &'a Option<Spanned<HeadersByType>>,
    expires: &'a Option<Spanned<ExpiresByType>>,
}

impl SiteFile {
    fn header_keys(&self) -> HeaderKeys<'_> {
        HeaderKeys {
            add_headers: &self.add_headers,
            remove_headers: &self.remove_headers,
            headers_by_type: &self.headers_by_type,
            expires: &self.expires,
        }
    }
}

impl RouteFile {
    fn header_keys(&self) -> HeaderKeys<'_> {
        HeaderKeys {
            add_headers: &self.add_headers,
            remove_headers: &self.remove_headers,
            headers_by_type: &self.headers_by_type,
            expires: &self.expires,
        }
    }

    fn compress_keys(&self) -> CompressKeys<'_> {
        CompressKeys {
            compress: self.compress.as_ref(),
            compress_min_size: self.compress_min_size.as_ref(),
            compress_types: self.compress_types.as_ref(),
            compress_level: self.compress_level.as_ref(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Codings {
    On(bool),
    List(Vec<String>),
}

/// `rate_limit = { per_second = 10, burst = 20 }`, by client network.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitFile {
    per_second: u32,
    burst: Option<u32>,
    /// Requests past the burst that wait their turn (let through at the rate) rather than
    /// being refused: nginx's `limit_req burst=` without `nodelay`.
    queue: Option<u32>,
    ipv4_prefix: Option<u8>,
    ipv6_prefix: Option<u8>,
    /// Networks never limited (default: loopback; `""`: none).
    exempt: Option<String>,
    /// Peers whose `X-Forwarded-For` names the client counted (default: the route's
    /// `trusted_proxies`).
    trusted_proxies: Option<String>,
}

/// `health_check = { path = "/healthz", interval = 5, timeout = 2, status = "200-399",
/// rise = 2, fall = 3 }`; every key optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthCheckFile {
    path: Option<String>,
    interval: Option<u64>,
    timeout: Option<u64>,
    status: Option<String>,
    rise: Option<u32>,
    fall: Option<u32>,
}

/// `proxy = "127.0.0.1:8080"` or `proxy = ["a:1", "unix:/run/app.sock"]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Servers {
    One(String),
    Many(Vec<String>),
}

/// One name or a list of them (`index = "index.php"` or `["index.php", "index.html"]`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Names {
    One(String),
    Many(Vec<String>),
}

/// A checked file, paths resolved against its folder.
#[derive(Debug)]
pub struct RunConfig {
    file: RunFile,
    /// The folder relative paths are taken from.
    dir: PathBuf,
    pub sites: Vec<SitePlan>,
    /// Index into `sites` of the site for unknown hosts; `None`: they get 421.
    pub default_site: Option<usize>,
    pub app: Option<AppPlan>,
}

#[derive(Debug)]
pub struct SitePlan {
    pub name: String,
    /// Normalised host patterns.
    pub hosts: Vec<String>,
    pub routes: Vec<RoutePlan>,
    pub log: SiteLog,
    pub error_pages: Vec<tern_vhost::ErrorPage>,
    /// Requests get ids; these peers may bring their own.
    pub request_ids: Option<tern_services::TrustedProxies>,
    /// On-the-fly compression of answers no route took.
    pub compress: Option<std::sync::Arc<tern_compress::Policy>>,
    /// Header edits on every answer of the site (each route's own go over them).
    pub headers: HeaderEdits,
}

/// Where a site's access-log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SiteLog {
    /// The server-wide log (`access_log` at the top, or `--access-log`), if there is one.
    Shared,
    Off,
    Own(PathBuf, LogFormatArg),
}

#[derive(Debug)]
pub struct RoutePlan {
    pub prefix: String,
    /// The route's `route` label on /metrics, and its upstream group's name after the site's:
    /// its `name`, or its path as written.
    pub label: String,
    pub kind: RouteKind,
    pub headers: HeaderEdits,
    /// Behind the gateway (`gate = true`).
    pub guarded: bool,
    pub options: RouteOptionsPlan,
}

/// A route's matchers, limits and path changes, checked.
#[derive(Debug, Default)]
pub struct RouteOptionsPlan {
    pub matchers: tern_vhost::MatchSpec,
    pub try_files: Vec<String>,
    pub strip_prefix: bool,
    /// Takes paths with `%2F`, opaque inside their segment.
    pub allow_encoded_slash: bool,
    pub max_body: Option<u64>,
    pub rate_limit: Option<tern_services::RateLimitConfig>,
    /// On-the-fly compression (the site's keys where the route gives none).
    pub compress: Option<std::sync::Arc<tern_compress::Policy>>,
}

/// Per-route rate-limit buckets per worker: one byte each, so 16 KiB per worker and route.
const ROUTE_RATE_BUCKETS: usize = 1 << 14;
/// The largest error page (they are held in memory).
const MAX_ERROR_PAGE: u64 = 1 << 20;
/// The server's `max_body` when neither file nor flag gives one (as `tern serve`).
const DEFAULT_MAX_BODY: u64 = 1024 * 1024;

#[derive(Debug)]
pub enum RouteKind {
    Static(StaticOptions),
    Redirect {
        status: u16,
        target: String,
        keep_path: bool,
    },
    Respond {
        status: u16,
        body: String,
        content_type: String,
    },
    /// The IPv4 Games (see [`RunConfig::app`]).
    App,
    /// Routed again on the site with this path (`$uri`, `$1`..`$9`).
    Rewrite(String),
    Proxy(Box<ProxyPlan>),
    /// Static files under a root, and its `*.php` scripts run on FastCGI servers.
    FastCgi {
        files: StaticOptions,
        upstream: Box<ProxyPlan>,
        /// What a folder's path runs.
        index: tern_proxy::fastcgi::Index,
        /// The config's own CGI parameters.
        params: Vec<tern_proxy::fastcgi::Param>,
    },
    /// The server's and process's counters, for loopback and `trusted` peers.
    Counters {
        prometheus: bool,
        trusted: tern_services::TrustedProxies,
    },
}

/// Where Debian keeps the system's CA certificates (what `rustls-native-certs` reads there).
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A proxy route's upstreams and how requests reach them.
#[derive(Debug, Clone)]
pub struct ProxyPlan {
    pub group: tern_proxy::GroupOptions,
    pub options: tern_proxy::ProxyOptions,
    /// Files TLS to the upstreams reads (a CA file, a client certificate and key), read again
    /// on reload inside the sandbox.
    pub tls_files: Vec<PathBuf>,
}

/// The one app instance: where its database and pages are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppPlan {
    /// The journal's folder; `None` with a PostgreSQL `store`.
    pub data: Option<PathBuf>,
    pub store: Option<String>,
    pub pages: PathBuf,
}

const REDIRECT_STATUSES: [u16; 5] = [301, 302, 303, 307, 308];

/// Fields the connection writes itself; a route can neither set nor remove them.
const CONNECTION_FIELDS: [&str; 8] = [
    "connection",
    "content-length",
    "date",
    "keep-alive",
    "server",
    "transfer-encoding",
    "upgrade",
    "proxy-connection",
];

/// Reads and checks a file; every problem as `config FILE: line N: what`.
pub fn load(path: &Path) -> Result<RunConfig, Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![format!("config {}: cannot read: {e}", path.display())])?;
    let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
    parse(&text, &dir).map_err(|problems| {
        problems
            .into_iter()
            .map(|p| format!("config {}: {p}", path.display()))
            .collect()
    })
}

/// Collects problems as `line N: what`.
struct Problems<'t> {
    text: &'t str,
    list: Vec<String>,
}

impl Problems<'_> {
    fn at(&mut self, offset: usize, what: impl std::fmt::Display) {
        self.list
            .push(format!("line {}: {what}", line_of(self.text, offset)));
    }

    fn line(&self, offset: usize) -> usize {
        line_of(self.text, offset)
    }
}

/// Parses and checks file text; relative paths are taken from `dir`.
pub fn parse(text: &str, dir: &Path) -> Result<RunConfig, Vec<String>> {
    let file: RunFile = toml::from_str(text).map_err(|e| vec![describe(text, &e)])?;
    let mut p = Problems {
        text,
        list: Vec::new(),
    };
    check_server_keys(&file, &mut p);
    if file.site.is_empty() {
        p.list
            .push("no [[site]]: the file serves nothing (see examples/tern.toml)".into());
    }
    let mut sites = Vec::new();
    let mut default_site: Option<(usize, String, usize)> = None;
    // name → line; host → (site name, line)
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    let mut hosts: BTreeMap<String, (String, usize)> = BTreeMap::new();
    let mut app: Option<(AppPlan, usize)> = None;
    for (index, site) in file.site.iter().enumerate() {
        let name = site.name.get_ref().clone();
        let name_at = site.name.span().start;
        if name.trim().is_empty() {
            p.at(name_at, "a site's name must not be empty");
        } else if let Some(line) = names.get(&name) {
            p.at(
                name_at,
                format!("site name {name:?} is already used (line {line})"),
            );
        } else {
            names.insert(name.clone(), p.line(name_at));
        }
        let mut patterns = Vec::new();
        for host in &site.hosts {
            match tern_vhost::normalize_pattern(host.get_ref()) {
                Err(e) => p.at(host.span().start, format!("host {:?} {e}", host.get_ref())),
                Ok(pattern) => match hosts.get(&pattern) {
                    Some((other, line)) => p.at(
                        host.span().start,
                        format!("host {pattern} is already taken by site {other:?} (line {line})"),
                    ),
                    None => {
                        hosts.insert(pattern.clone(), (name.clone(), p.line(host.span().start)));
                        patterns.push(pattern);
                    }
                },
            }
        }
        let is_default = site.default.as_ref().is_some_and(|d| *d.get_ref());
        if is_default {
            let at = site.default.as_ref().map_or(name_at, |d| d.span().start);
            match &default_site {
                Some((_, other, line)) => p.at(
                    at,
                    format!("two default sites: {other:?} (line {line}) and {name:?}"),
                ),
                None => default_site = Some((index, name.clone(), p.line(at))),
            }
        }
        if site.hosts.is_empty() && !is_default {
            p.at(
                name_at,
                format!("site {name:?} has no hosts and is not the default: nothing chooses it"),
            );
        }
        if site.route.is_empty() {
            p.at(name_at, format!("site {name:?} has no [[site.route]]"));
        }
        // stored prefix → (line, the route has matchers beyond its path)
        let mut prefixes: BTreeMap<String, (usize, bool)> = BTreeMap::new();
        // route label → (line, given as a `name`)
        let mut labels: BTreeMap<String, (usize, bool)> = BTreeMap::new();
        let mut routes = Vec::new();
        let site_compress = check_compress_keys(site.compress_keys(), &mut p);
        let site_policy = compress_policy(site.compress_keys(), CompressKeys::default());
        for route in &site.route {
            let path_at = route.path.span().start;
            let prefix = route.path.get_ref();
            let mut options = check_route_options(route, &file, &mut p);
            let route_compress = check_compress_keys(route.compress_keys(), &mut p);
            if site_compress && route_compress {
                let policy = compress_policy(route.compress_keys(), site.compress_keys());
                check_compress_off(route.compress_keys(), policy.is_some(), &mut p);
                if let Some(o) = options.as_mut() {
                    o.compress = policy;
                }
            }
            let has_matchers = [
                at(&route.methods),
                at(&route.match_headers),
                at(&route.match_query),
                at(&route.match_headers_regex),
                at(&route.path_glob),
                at(&route.path_regex),
            ]
            .iter()
            .any(Option::is_some);
            if !prefix.starts_with('/') {
                p.at(path_at, format!("path {prefix:?} must start with /"));
            } else if prefix
                .bytes()
                .any(|b| b.is_ascii_control() || b == b' ' || b == b'?' || b == b'#')
            {
                p.at(
                    path_at,
                    format!("path {prefix:?} must be a plain path (no spaces, ? or #)"),
                );
            } else {
                let stored = prefix.trim_end_matches('/').to_string();
                match prefixes.get(&stored) {
                    Some((line, false)) => p.at(
                        path_at,
                        format!(
                            "path {prefix:?} is already routed on this site (line {line}) by a \
                             route with no other matcher, which takes every request first"
                        ),
                    ),
                    Some(_) if has_matchers => {}
                    _ => {
                        prefixes.insert(stored, (p.line(path_at), has_matchers));
                    }
                }
            }
            let label = check_route_name(route, &mut labels, &mut p);
            let guarded = route.gate.as_ref().is_some_and(|g| *g.get_ref());
            if let (Some(g), true) = (&route.gate, guarded) {
                if file.gate.is_none() {
                    p.at(
                        g.span().start,
                        "gate = true needs a gate config: add gate = \"gate.toml\" at the top",
                    );
                }
            }
            if let Some(kind) = check_route(route, dir, &mut p, &mut app) {
                if guarded
                    && !matches!(
                        kind,
                        RouteKind::Static(_)
                            | RouteKind::App
                            | RouteKind::Proxy(_)
                            | RouteKind::FastCgi { .. }
                    )
                {
                    p.at(path_at, "gate = true is for static, app and proxy routes");
                }
                let headers = check_headers(route.header_keys(), &mut p);
                if let Some(options) = options {
                    routes.push((
                        p.line(path_at),
                        RoutePlan {
                            prefix: prefix.clone(),
                            label,
                            kind,
                            headers,
                            guarded,
                            options,
                        },
                    ));
                }
            }
        }
        if !site.request_id.as_ref().is_some_and(|r| *r.get_ref()) {
            let site_keys = [("add_headers", &site.add_headers)];
            let route_keys = site.route.iter().flat_map(|route| {
                [
                    ("add_headers", &route.add_headers),
                    ("add_request_headers", &route.add_request_headers),
                ]
            });
            for (key, value) in site_keys.into_iter().chain(route_keys) {
                if let Some(v) = value {
                    if v.get_ref()
                        .values()
                        .any(|v| v.contains("$request_id") || v.contains("${request_id}"))
                    {
                        p.at(
                            v.span().start,
                            format!("{key}: $request_id needs request_id = true on the site"),
                        );
                    }
                }
            }
        }
        check_loops(&routes, &mut p);
        check_encoded_slash(&site.route, &mut p);
        let routes: Vec<RoutePlan> = routes.into_iter().map(|(_, r)| r).collect();
        let error_pages = check_error_pages(site, dir, &mut p);
        let request_ids = check_request_ids(site, &mut p);
        let log = match &site.access_log {
            None => SiteLog::Shared,
            Some(v) if v.get_ref() == "off" => SiteLog::Off,
            Some(v) if v.get_ref().trim().is_empty() => {
                p.at(v.span().start, "access_log must be a file or \"off\"");
                SiteLog::Off
            }
            Some(v) => SiteLog::Own(
                dir.join(v.get_ref()),
                site.access_log_format
                    .as_ref()
                    .map_or(LogFormatArg::Combined, |f| *f.get_ref()),
            ),
        };
        if let (Some(f), false) = (&site.access_log_format, matches!(log, SiteLog::Own(..))) {
            p.at(
                f.span().start,
                "access_log_format is for a site with its own access_log file",
            );
        }
        let headers = check_headers(site.header_keys(), &mut p);
        sites.push(SitePlan {
            name,
            hosts: patterns,
            routes,
            log,
            error_pages,
            request_ids,
            compress: site_policy.filter(|_| site_compress),
            headers,
        });
    }
    if !p.list.is_empty() {
        return Err(p.list);
    }
    Ok(RunConfig {
        file,
        dir: dir.to_path_buf(),
        sites,
        default_site: default_site.map(|(i, _, _)| i),
        app: app.map(|(a, _)| a),
    })
}

/// The longest route `name`: a label value of every series of the route.
const MAX_ROUTE_NAME: usize = 64;

/// A route's label (its `name`, or its path as written), checked: a name is 1 to
/// [`MAX_ROUTE_NAME`] of `A-Z a-z 0-9 _ . : / -`, not the shared row's `_other`, and no two
/// routes of a site have one label unless both go by their path (routes of one path told
/// apart by matchers share their series then, by choice). `labels`: the site's so far.
fn check_route_name(
    route: &RouteFile,
    labels: &mut BTreeMap<String, (usize, bool)>,
    p: &mut Problems<'_>,
) -> String {
    let (label, at, named) = match &route.name {
        Some(name) => (name.get_ref().clone(), name.span().start, true),
        None => (route.path.get_ref().clone(), route.path.span().start, false),
    };
    if named {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "_.:/-".contains(c);
        if label.is_empty() || label.len() > MAX_ROUTE_NAME {
            p.at(
                at,
                format!("route name {label:?} must be 1 to {MAX_ROUTE_NAME} characters"),
            );
            return label;
        }
        if let Some(c) = label.chars().find(|&c| !allowed(c)) {
            p.at(
                at,
                format!(
                    "route name {label:?} has {c:?}: use A-Z a-z 0-9 and _ . : / - (it is a \
                     label value on /metrics)"
                ),
            );
            return label;
        }
        if label == tern_server::OTHER {
            p.at(
                at,
                format!("route name {label:?} is what /metrics calls the routes past its bound"),
            );
            return label;
        }
    }
    match labels.get(&label) {
        Some(&(line, earlier_named)) if named || earlier_named => {
            let what = if named { "name" } else { "path" };
            let other = if earlier_named { "name" } else { "path" };
            p.at(
                at,
                format!(
                    "route {what} {label:?} is the {other} of another route of this site (line \
                     {line}): their figures on /metrics would be one series; give one a name \
                     of its own"
                ),
            );
        }
        Some(_) => {}
        None => {
            labels.insert(label.clone(), (p.line(at), named));
        }
    }
    label
}

fn check_server_keys(file: &RunFile, p: &mut Problems<'_>) {
    if let Some(tls) = &file.tls {
        if let Err(list) = tls.redirect_settings() {
            for (at, what) in list {
                p.at(at, format!("[tls] {what}"));
            }
        }
        if let Some(at) = tls.redirect_keys_without_listener() {
            p.at(
                at,
                "[tls] redirect_http_status and redirect_http_hosts need redirect_http (the \
                 plain listener that answers with them)",
            );
        }
    }
    for (key, value) in [
        ("header_timeout", &file.header_timeout),
        ("body_timeout", &file.body_timeout),
        ("idle_timeout", &file.idle_timeout),
        ("write_timeout", &file.write_timeout),
    ] {
        if let Some(v) = value.as_ref().filter(|v| *v.get_ref() == 0) {
            p.at(
                v.span().start,
                format!("{key} must be at least 1 (seconds)"),
            );
        }
    }
    for (key, value) in [
        ("workers", &file.workers),
        ("max_connections", &file.max_connections),
    ] {
        if let Some(v) = value.as_ref().filter(|v| *v.get_ref() == 0) {
            p.at(v.span().start, format!("{key} must be at least 1"));
        }
    }
}

/// The server's order of preference when `compress = true`: zstd costs the server least for
/// a ratio like brotli's at these levels, gzip is what every client has.
const DEFAULT_CODINGS: [tern_compress::Encoding; 3] = [
    tern_compress::Encoding::Zstd,
    tern_compress::Encoding::Br,
    tern_compress::Encoding::Gzip,
];

/// Checks one level's compression keys (a site's or a route's); false when one is unusable.
fn check_compress_keys(keys: CompressKeys<'_>, p: &mut Problems<'_>) -> bool {
    let mut ok = true;
    if let Some(c) = keys.compress {
        if let Codings::List(list) = c.get_ref() {
            if list.is_empty() {
                p.at(
                    c.span().start,
                    "compress = [] names no coding: write compress = false to turn it off",
                );
                ok = false;
            }
            for name in list {
                if tern_compress::Encoding::from_name(name).is_none() {
                    p.at(
                        c.span().start,
                        format!("compress: unknown coding {name:?}: the codings are \"zstd\", \"br\" and \"gzip\""),
                    );
                    ok = false;
                }
            }
            if ok {
                if let Err(e) = tern_compress::Policy::with_defaults(&codings(list)) {
                    p.at(c.span().start, format!("compress: {e}"));
                    ok = false;
                }
            }
        }
    }
    if let Some(types) = keys.compress_types {
        if let Err(e) = tern_compress::Policy::new(&DEFAULT_CODINGS, 0, types.get_ref()) {
            p.at(types.span().start, format!("compress_types: {e}"));
            ok = false;
        }
    }
    if let Some(levels) = keys.compress_level {
        if let Err(e) = levels_over(tern_compress::Levels::default(), levels.get_ref()) {
            p.at(levels.span().start, format!("compress_level: {e}"));
            ok = false;
        }
    }
    ok
}

/// `base` with the levels a `compress_level` table sets.
fn levels_over(
    mut base: tern_compress::Levels,
    table: &BTreeMap<String, u32>,
) -> Result<tern_compress::Levels, String> {
    for (name, level) in table {
        let coding = tern_compress::Encoding::from_name(name).ok_or_else(|| {
            format!("unknown coding {name:?}: the codings are \"zstd\", \"br\" and \"gzip\"")
        })?;
        base.set(coding, *level)?;
    }
    Ok(base)
}

fn codings(list: &[String]) -> Vec<tern_compress::Encoding> {
    list.iter()
        .filter_map(|n| tern_compress::Encoding::from_name(n))
        .collect()
}

/// The policy of checked keys, each taken from `own` if given there, else from `inherited`,
/// else the default; `None` when compression is off.
fn compress_policy(
    own: CompressKeys<'_>,
    inherited: CompressKeys<'_>,
) -> Option<std::sync::Arc<tern_compress::Policy>> {
    let codings = match own.compress.or(inherited.compress)?.get_ref() {
        Codings::On(false) => return None,
        Codings::On(true) => DEFAULT_CODINGS.to_vec(),
        Codings::List(list) => codings(list),
    };
    let min = own
        .compress_min_size
        .or(inherited.compress_min_size)
        .map_or(tern_compress::DEFAULT_MIN_SIZE, |v| *v.get_ref());
    let types: Vec<String> = match own.compress_types.or(inherited.compress_types) {
        Some(t) => t.get_ref().clone(),
        None => tern_compress::DEFAULT_TYPES
            .iter()
            .map(|t| t.to_string())
            .collect(),
    };
    // The site's levels, then the route's own over them (checked already).
    let mut levels = tern_compress::Levels::default();
    for table in [inherited.compress_level, own.compress_level]
        .into_iter()
        .flatten()
    {
        levels = levels_over(levels, table.get_ref()).ok()?;
    }
    tern_compress::Policy::new(&codings, min, &types)
        .ok()
        .map(|p| std::sync::Arc::new(p.with_levels(levels)))
}

/// `compress_min_size` or `compress_types` where compression is off would do nothing: the
/// file probably meant something else.
fn check_compress_off(keys: CompressKeys<'_>, on: bool, p: &mut Problems<'_>) {
    if on {
        return;
    }
    for (key, at) in [
        (
            "compress_min_size",
            keys.compress_min_size.map(|v| v.span().start),
        ),
        (
            "compress_types",
            keys.compress_types.map(|v| v.span().start),
        ),
        (
            "compress_level",
            keys.compress_level.map(|v| v.span().start),
        ),
    ] {
        if let Some(at) = at {
            p.at(
                at,
                format!("{key} does nothing here: compression is off (set compress)"),
            );
        }
    }
}

/// Where a key's value starts in the file, if the key is there.
fn at<T>(value: &Option<Spanned<T>>) -> Option<usize> {
    value.as_ref().map(|v| v.span().start)
}

/// The route's kind, with its own keys checked; `None` when it has problems.
fn check_route(
    route: &RouteFile,
    dir: &Path,
    p: &mut Problems<'_>,
    app: &mut Option<(AppPlan, usize)>,
) -> Option<RouteKind> {
    let path_at = route.path.span().start;
    let kinds: Vec<(&str, usize)> = [
        ("static", at(&route.static_root)),
        ("redirect", at(&route.redirect)),
        ("respond", at(&route.respond)),
        ("app", at(&route.app)),
        ("proxy", at(&route.proxy)),
        ("counters", at(&route.counters)),
        ("rewrite", at(&route.rewrite)),
    ]
    .into_iter()
    .filter_map(|(k, at)| at.map(|at| (k, at)))
    .collect();
    // `fastcgi` goes with `static` (the document root): a route of its own kind.
    let fastcgi = route.fastcgi.as_ref().map(|f| f.span().start);
    let kind = match kinds.as_slice() {
        [("static", _)] if fastcgi.is_some() => "fastcgi",
        [] if fastcgi.is_some() => {
            p.at(
                fastcgi.unwrap_or(path_at),
                "`fastcgi` needs `static`: the folder its scripts (and the other files) are in",
            );
            return None;
        }
        [] => {
            p.at(
                path_at,
                "a route needs one of `static`, `redirect`, `respond`, `app`, `proxy`, `counters` or `rewrite`",
            );
            return None;
        }
        [(one, _)] => *one,
        [(first, _), (second, at), ..] => {
            p.at(
                *at,
                format!("a route has one kind, but both `{first}` and `{second}` are given"),
            );
            return None;
        }
    };
    // Keys that belong to one kind or two; any other kind must not have them.
    let owned: [(&str, Option<usize>, &[&str]); 34] = [
        ("fastcgi", fastcgi, &["fastcgi"]),
        ("index", at(&route.index), &["fastcgi"]),
        ("fastcgi_params", at(&route.fastcgi_params), &["fastcgi"]),
        ("try_files", at(&route.try_files), &["static", "fastcgi"]),
        ("strip_prefix", at(&route.strip_prefix), &["proxy"]),
        (
            "allow_encoded_slash",
            at(&route.allow_encoded_slash),
            &["proxy"],
        ),
        (
            "add_request_headers",
            at(&route.add_request_headers),
            &["proxy"],
        ),
        (
            "remove_request_headers",
            at(&route.remove_request_headers),
            &["proxy"],
        ),
        ("balance", at(&route.balance), &["proxy", "fastcgi"]),
        ("proxy_host", at(&route.proxy_host), &["proxy"]),
        (
            "proxy_tls_server_name",
            at(&route.proxy_tls_server_name),
            &["proxy"],
        ),
        ("proxy_tls_ca", at(&route.proxy_tls_ca), &["proxy"]),
        (
            "proxy_tls_client_cert",
            at(&route.proxy_tls_client_cert),
            &["proxy"],
        ),
        (
            "proxy_tls_client_key",
            at(&route.proxy_tls_client_key),
            &["proxy"],
        ),
        ("max_fails", at(&route.max_fails), &["proxy", "fastcgi"]),
        (
            "fail_timeout",
            at(&route.fail_timeout),
            &["proxy", "fastcgi"],
        ),
        (
            "connect_timeout",
            at(&route.connect_timeout),
            &["proxy", "fastcgi"],
        ),
        (
            "first_byte_timeout",
            at(&route.first_byte_timeout),
            &["proxy", "fastcgi"],
        ),
        (
            "upstream_idle_timeout",
            at(&route.upstream_idle_timeout),
            &["proxy", "fastcgi"],
        ),
        ("keepalive", at(&route.keepalive), &["proxy", "fastcgi"]),
        ("retries", at(&route.retries), &["proxy", "fastcgi"]),
        (
            "retry_budget",
            at(&route.retry_budget),
            &["proxy", "fastcgi"],
        ),
        (
            "retry_on_status",
            at(&route.retry_on_status),
            &["proxy", "fastcgi"],
        ),
        // Checks speak HTTP: a FastCGI server would fail them all.
        ("health_check", at(&route.health_check), &["proxy"]),
        (
            "trusted_proxies",
            at(&route.trusted_proxies),
            &["proxy", "counters", "fastcgi"],
        ),
        (
            "serve_dotfiles",
            at(&route.serve_dotfiles),
            &["static", "fastcgi"],
        ),
        (
            "cache_control",
            at(&route.cache_control),
            &["static", "fastcgi"],
        ),
        (
            "max_cached_size",
            at(&route.max_cached_size),
            &["static", "fastcgi"],
        ),
        ("keep_path", at(&route.keep_path), &["redirect"]),
        ("content_type", at(&route.content_type), &["respond"]),
        ("status", at(&route.status), &["redirect", "respond"]),
        ("data", at(&route.data), &["app"]),
        ("store", at(&route.store), &["app"]),
        ("pages", at(&route.pages), &["app"]),
    ];
    let mut ok = true;
    for (key, at, kinds) in owned {
        if let Some(at) = at {
            if !kinds.contains(&kind) {
                p.at(at, format!("`{key}` does not apply to a {kind} route"));
                ok = false;
            }
        }
    }
    let kind = match kind {
        "static" => check_static(route, dir, p),
        "redirect" => check_redirect(route, p),
        "respond" => check_respond(route, p),
        "proxy" => check_proxy(route, dir, p),
        "fastcgi" => check_fastcgi(route, dir, p),
        "counters" => check_counters(route, p),
        "rewrite" => check_rewrite_kind(route, p),
        _ => check_app(route, dir, p, app),
    };
    kind.filter(|_| ok)
}

fn check_static(route: &RouteFile, dir: &Path, p: &mut Problems<'_>) -> Option<RouteKind> {
    let root_value = route.static_root.as_ref()?;
    let root = dir.join(root_value.get_ref());
    let mut ok = true;
    match std::fs::metadata(&root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            p.at(
                root_value.span().start,
                format!("static root {} is not a folder", root.display()),
            );
            ok = false;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            p.at(
                root_value.span().start,
                format!("static root {} does not exist", root.display()),
            );
            ok = false;
        }
        Err(e) => {
            p.at(
                root_value.span().start,
                format!("static root {}: {e}", root.display()),
            );
            ok = false;
        }
    }
    if let Some(cc) = &route.cache_control {
        if cc.get_ref().bytes().any(|b| b.is_ascii_control()) {
            p.at(
                cc.span().start,
                "cache_control must not hold control characters",
            );
            ok = false;
        }
    }
    let defaults = StaticOptions::default();
    ok.then(|| {
        RouteKind::Static(StaticOptions {
            root,
            serve_dotfiles: route.serve_dotfiles.as_ref().is_some_and(|v| *v.get_ref()),
            cache_control: route.cache_control.as_ref().map(|v| v.get_ref().clone()),
            max_cached_size: route
                .max_cached_size
                .as_ref()
                .map_or(defaults.max_cached_size, |v| *v.get_ref()),
            ..defaults
        })
    })
}

fn check_redirect(route: &RouteFile, p: &mut Problems<'_>) -> Option<RouteKind> {
    let target = route.redirect.as_ref()?;
    let mut ok = true;
    let t = target.get_ref();
    let scheme_or_path =
        t.starts_with("https://") || t.starts_with("http://") || t.starts_with('/');
    if !scheme_or_path || t.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        p.at(
            target.span().start,
            format!("redirect target {t:?} must be an http:// or https:// URL or a path starting with /, without spaces"),
        );
        ok = false;
    }
    let status = route.status.as_ref().map_or(308, |s| *s.get_ref());
    if !REDIRECT_STATUSES.contains(&status) {
        let at = route
            .status
            .as_ref()
            .map_or(target.span().start, |s| s.span().start);
        p.at(
            at,
            format!("status {status} is not a redirect (301, 302, 303, 307 or 308)"),
        );
        ok = false;
    }
    ok.then(|| RouteKind::Redirect {
        status,
        target: t.clone(),
        keep_path: route.keep_path.as_ref().is_none_or(|v| *v.get_ref()),
    })
}

fn check_respond(route: &RouteFile, p: &mut Problems<'_>) -> Option<RouteKind> {
    let body = route.respond.as_ref()?;
    let mut ok = true;
    let status = route.status.as_ref().map_or(200, |s| *s.get_ref());
    let status_at = route
        .status
        .as_ref()
        .map_or(body.span().start, |s| s.span().start);
    if !(200..=599).contains(&status) {
        p.at(
            status_at,
            format!("status {status} is not a final HTTP status (200 to 599)"),
        );
        ok = false;
    } else if matches!(status, 204 | 304) && !body.get_ref().is_empty() {
        p.at(
            status_at,
            format!("status {status} has no body: give respond = \"\""),
        );
        ok = false;
    }
    let content_type = route
        .content_type
        .as_ref()
        .map_or("text/plain; charset=utf-8".to_string(), |v| {
            v.get_ref().clone()
        });
    if content_type.is_empty() || content_type.bytes().any(|b| b.is_ascii_control()) {
        let at = route
            .content_type
            .as_ref()
            .map_or(body.span().start, |v| v.span().start);
        p.at(
            at,
            "content_type must be non-empty, without control characters",
        );
        ok = false;
    }
    ok.then(|| RouteKind::Respond {
        status,
        body: body.get_ref().clone(),
        content_type,
    })
}

fn check_app(
    route: &RouteFile,
    dir: &Path,
    p: &mut Problems<'_>,
    app: &mut Option<(AppPlan, usize)>,
) -> Option<RouteKind> {
    let name = route.app.as_ref()?;
    let mut ok = true;
    if name.get_ref() != "ipv4-games" {
        p.at(
            name.span().start,
            format!(
                "unknown app {:?}: the one app is \"ipv4-games\"",
                name.get_ref()
            ),
        );
        ok = false;
    }
    if !route.path.get_ref().trim_end_matches('/').is_empty() {
        p.at(
            route.path.span().start,
            "the app answers absolute paths (/claim/NAME, /score...): give it path = \"/\"",
        );
        ok = false;
    }
    let store = match (&route.data, &route.store) {
        (None, None) => {
            p.at(
                name.span().start,
                "an app route needs `data` (the folder of its journal) or `store` (a postgres:// URL)",
            );
            return None;
        }
        (Some(_), Some(store)) => {
            p.at(
                store.span().start,
                "give an app route `data` or `store`, not both",
            );
            return None;
        }
        (_, Some(store)) => {
            let url = store.get_ref();
            let endpoints = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                tern_ipv4_games::store::postgres::endpoints(url)
            } else {
                Err(format!("{url:?} is not a postgres:// URL"))
            };
            if let Err(e) = endpoints {
                p.at(store.span().start, format!("store: {e}"));
                ok = false;
            }
            Some(url.clone())
        }
        (Some(_), None) => None,
    };
    let pages = match &route.pages {
        Some(pages) => {
            let path = dir.join(pages.get_ref());
            if !path.is_dir() {
                p.at(
                    pages.span().start,
                    format!("pages {} is not a folder", path.display()),
                );
                ok = false;
            }
            path
        }
        None => tern_ipv4_games::bundled_site(),
    };
    let plan = AppPlan {
        data: route.data.as_ref().map(|d| dir.join(d.get_ref())),
        store,
        pages,
    };
    if let Some((_, line)) = app {
        p.at(
            name.span().start,
            format!("at most one app route: the IPv4 Games runs once per server (line {line})"),
        );
        return None;
    }
    *app = Some((plan, p.line(name.span().start)));
    ok.then_some(RouteKind::App)
}

fn check_proxy(route: &RouteFile, dir: &Path, p: &mut Problems<'_>) -> Option<RouteKind> {
    let servers = route.proxy.as_ref().or(route.fastcgi.as_ref())?;
    let at = servers.span().start;
    let list: Vec<&String> = match servers.get_ref() {
        Servers::One(s) => vec![s],
        Servers::Many(v) => v.iter().collect(),
    };
    let mut ok = true;
    if list.is_empty() {
        p.at(at, "proxy needs at least one upstream server");
        ok = false;
    }
    if list.len() > 64 {
        p.at(at, "at most 64 upstream servers per route");
        ok = false;
    }
    let mut group = tern_proxy::GroupOptions::default();
    // Each server's host when it is written https://host:port.
    let mut tls_hosts = Vec::new();
    for s in &list {
        match parse_server(s, dir) {
            Ok((server, tls_host)) => {
                group.servers.push(server);
                tls_hosts.push(tls_host);
            }
            Err(why) => {
                p.at(at, format!("upstream {s:?}: {why}"));
                ok = false;
            }
        }
    }
    ok &= check_upstream_tls(route, dir, at, &tls_hosts, &mut group, p);
    let tls_files = match &group.tls {
        None => Vec::new(),
        // The system's roots (Debian's bundle) when no CA file is given.
        Some(_) => [
            &route.proxy_tls_ca,
            &route.proxy_tls_client_cert,
            &route.proxy_tls_client_key,
        ]
        .into_iter()
        .map(|v| v.as_ref().map(|v| dir.join(v.get_ref())))
        .enumerate()
        .filter_map(|(i, f)| match (i, f) {
            // (A rule for a missing file would stop the sandbox from applying.)
            (0, None) => Path::new(SYSTEM_CA_BUNDLE)
                .exists()
                .then(|| PathBuf::from(SYSTEM_CA_BUNDLE)),
            (_, f) => f,
        })
        .collect(),
    };
    if !group.servers.is_empty() && group.servers.iter().all(|s| s.backup) {
        p.at(at, "every upstream is a backup: at least one must not be");
        ok = false;
    }
    if let Some(b) = &route.balance {
        group.balance = match b.get_ref().as_str() {
            "round_robin" => tern_proxy::Balance::RoundRobin,
            "least_conn" => tern_proxy::Balance::LeastConn,
            other => {
                p.at(
                    b.span().start,
                    format!("balance {other:?}: use \"round_robin\" or \"least_conn\""),
                );
                ok = false;
                tern_proxy::Balance::RoundRobin
            }
        };
    }
    if let Some(n) = &route.max_fails {
        if *n.get_ref() == 0 {
            p.at(n.span().start, "max_fails must be at least 1");
            ok = false;
        }
        group.max_fails = *n.get_ref();
    }
    let secs = |v: &Option<Spanned<u64>>, key: &str, p: &mut Problems<'_>, ok: &mut bool| {
        v.as_ref().map(|v| {
            if *v.get_ref() == 0 {
                p.at(
                    v.span().start,
                    format!("{key} must be at least 1 (seconds)"),
                );
                *ok = false;
            }
            std::time::Duration::from_secs(*v.get_ref())
        })
    };
    if let Some(d) = secs(&route.fail_timeout, "fail_timeout", p, &mut ok) {
        group.fail_timeout = d;
    }
    if let Some(d) = secs(&route.connect_timeout, "connect_timeout", p, &mut ok) {
        group.timeouts.connect = d;
    }
    if let Some(d) = secs(&route.first_byte_timeout, "first_byte_timeout", p, &mut ok) {
        group.timeouts.first_byte = d;
    }
    if let Some(d) = secs(
        &route.upstream_idle_timeout,
        "upstream_idle_timeout",
        p,
        &mut ok,
    ) {
        group.timeouts.idle = d;
    }
    if let Some(k) = &route.keepalive {
        group.keepalive = *k.get_ref();
    }
    if let Some(n) = &route.retries {
        group.retry.retries = *n.get_ref();
    }
    if let Some(d) = secs(&route.retry_budget, "retry_budget", p, &mut ok) {
        group.retry.budget = Some(d);
    }
    if let Some(list) = &route.retry_on_status {
        for &status in list.get_ref() {
            if !group.retry.retry_on(status) {
                p.at(
                    list.span().start,
                    format!("retry_on_status: {status} is not retried (only 502, 503 and 504 are)"),
                );
                ok = false;
            }
        }
    }
    if let Some(hc) = &route.health_check {
        match check_health(hc.get_ref(), route.proxy_host.as_ref().map(|h| h.get_ref())) {
            Ok(check) => group.health_check = Some(check),
            Err(why) => {
                p.at(hc.span().start, format!("health_check: {why}"));
                ok = false;
            }
        }
    }
    let mut options = tern_proxy::ProxyOptions::default();
    if let Some(h) = &route.proxy_host {
        let host = h.get_ref();
        if host.is_empty() || host.bytes().any(|b| !b.is_ascii_graphic()) {
            p.at(
                h.span().start,
                "proxy_host must be a host name (and port), without spaces",
            );
            ok = false;
        }
        options.host = Some(host.clone());
    }
    if let Some(t) = &route.trusted_proxies {
        match tern_services::TrustedProxies::parse(t.get_ref()) {
            Ok(list) => options.trusted = list,
            Err(e) => {
                p.at(t.span().start, format!("trusted_proxies: {e}"));
                ok = false;
            }
        }
    }
    let (set, remove) = check_edits(
        ("add_request_headers", &route.add_request_headers),
        ("remove_request_headers", &route.remove_request_headers),
        p,
    );
    options.request_headers = tern_proxy::RequestEdits {
        set: set.into_iter().map(|(n, _, t)| (n, t)).collect(),
        remove,
    };
    ok.then_some(RouteKind::Proxy(Box::new(ProxyPlan {
        group,
        options,
        tls_files,
    })))
}

/// `static` and `fastcgi`: the root's files, and its scripts on the FastCGI servers (checked
/// as a proxy's upstreams are).
fn check_fastcgi(route: &RouteFile, dir: &Path, p: &mut Problems<'_>) -> Option<RouteKind> {
    let files = check_static(route, dir, p);
    let upstream = check_proxy(route, dir, p);
    let index = match &route.index {
        None => Some(tern_proxy::fastcgi::Index::default()),
        Some(i) => {
            let list = match i.get_ref() {
                Names::One(one) => std::slice::from_ref(one),
                Names::Many(many) => many.as_slice(),
            };
            tern_proxy::fastcgi::check_index(list)
                .map_err(|e| p.at(i.span().start, e))
                .ok()
        }
    };
    let mut params = Vec::new();
    let mut params_ok = true;
    if let Some(table) = &route.fastcgi_params {
        if table.get_ref().len() > tern_proxy::fastcgi::MAX_PARAMS {
            p.at(
                table.span().start,
                format!(
                    "fastcgi_params: at most {} parameters",
                    tern_proxy::fastcgi::MAX_PARAMS
                ),
            );
            params_ok = false;
        }
        for (name, value) in table.get_ref() {
            match tern_proxy::fastcgi::check_param(name, value.get_ref()) {
                Ok(param) => params.push(param),
                Err(e) => {
                    p.at(value.span().start, e);
                    params_ok = false;
                }
            }
        }
    }
    match (files?, upstream?, index?) {
        (RouteKind::Static(files), RouteKind::Proxy(upstream), index) if params_ok => {
            Some(RouteKind::FastCgi {
                files,
                upstream,
                index,
                params,
            })
        }
        _ => None,
    }
}

fn check_counters(route: &RouteFile, p: &mut Problems<'_>) -> Option<RouteKind> {
    let kind = route.counters.as_ref()?;
    let prometheus = match kind.get_ref().as_str() {
        "statusz" => false,
        "metrics" => true,
        other => {
            p.at(
                kind.span().start,
                format!("counters {other:?}: use \"statusz\" (name: value lines) or \"metrics\" (Prometheus)"),
            );
            return None;
        }
    };
    let mut trusted = tern_services::TrustedProxies::default();
    if let Some(t) = &route.trusted_proxies {
        match tern_services::TrustedProxies::parse(t.get_ref()) {
            Ok(list) => trusted = list,
            Err(e) => {
                p.at(t.span().start, format!("trusted_proxies: {e}"));
                return None;
            }
        }
    }
    Some(RouteKind::Counters {
        prometheus,
        trusted,
    })
}

fn check_rewrite_kind(route: &RouteFile, p: &mut Problems<'_>) -> Option<RouteKind> {
    let target = route.rewrite.as_ref()?;
    let captures = tern_vhost::compile_pattern(
        route.path_glob.as_ref().map(|g| g.get_ref().as_str()),
        route.path_regex.as_ref().map(|r| r.get_ref().as_str()),
    )
    .ok()
    .flatten()
    .map_or(0, |re| (re.captures_len() - 1).min(9) as u8);
    match tern_vhost::check_rewrite(target.get_ref(), captures) {
        Ok(()) => Some(RouteKind::Rewrite(target.get_ref().clone())),
        Err(e) => {
            p.at(target.span().start, e);
            None
        }
    }
}

/// Matchers, `try_files`, `strip_prefix`, `max_body` and `rate_limit`; `None` when one is
/// unusable (each problem recorded).
fn check_route_options(
    route: &RouteFile,
    file: &RunFile,
    p: &mut Problems<'_>,
) -> Option<RouteOptionsPlan> {
    let mut ok = true;
    let mut plan = RouteOptionsPlan::default();
    let path_at = route.path.span().start;
    if let Some(m) = &route.methods {
        plan.matchers.methods = m.get_ref().clone();
    }
    if let Some(h) = &route.match_headers {
        plan.matchers.headers = h.get_ref().clone().into_iter().collect();
    }
    if let Some(q) = &route.match_query {
        plan.matchers.query = q.get_ref().clone().into_iter().collect();
    }
    plan.matchers.path_glob = route.path_glob.as_ref().map(|g| g.get_ref().clone());
    plan.matchers.path_regex = route.path_regex.as_ref().map(|r| r.get_ref().clone());
    // The same checks the site table makes, here with the key's line.
    if let Err(e) = tern_vhost::compile_pattern(
        plan.matchers.path_glob.as_deref(),
        plan.matchers.path_regex.as_deref(),
    ) {
        let at = at(&route.path_regex)
            .or(at(&route.path_glob))
            .unwrap_or(path_at);
        p.at(at, e);
        ok = false;
    }
    if let Some(h) = &route.match_headers_regex {
        for (name, pattern) in h.get_ref() {
            let one = tern_vhost::MatchSpec {
                header_patterns: vec![(name.clone(), pattern.clone())],
                ..Default::default()
            };
            match tern_vhost::check_matchers(&one) {
                Ok(()) => plan
                    .matchers
                    .header_patterns
                    .push((name.clone(), pattern.clone())),
                Err(e) => {
                    p.at(h.span().start, format!("match_headers_regex: {e}"));
                    ok = false;
                }
            }
        }
    }
    let only = |m: &tern_vhost::MatchSpec| tern_vhost::MatchSpec {
        path_glob: None,
        path_regex: None,
        header_patterns: Vec::new(),
        ..m.clone()
    };
    if let Err(e) = tern_vhost::check_matchers(&only(&plan.matchers)) {
        let at = at(&route.methods)
            .or(at(&route.match_headers))
            .or(at(&route.match_query))
            .unwrap_or(path_at);
        p.at(at, e);
        ok = false;
    }
    if let Some(list) = &route.try_files {
        match tern_vhost::check_try_files(list.get_ref()) {
            Ok(()) => plan.try_files = list.get_ref().clone(),
            Err(e) => {
                p.at(list.span().start, e);
                ok = false;
            }
        }
    }
    plan.strip_prefix = route.strip_prefix.as_ref().is_some_and(|v| *v.get_ref());
    plan.allow_encoded_slash = route
        .allow_encoded_slash
        .as_ref()
        .is_some_and(|v| *v.get_ref());
    if let Some(max) = &route.max_body {
        let server = file.max_body.unwrap_or(DEFAULT_MAX_BODY);
        if *max.get_ref() > server && route.proxy.is_none() {
            p.at(
                max.span().start,
                format!(
                    "max_body {} is above the server's max_body {server}: only a proxy route \
                     (which streams bodies) may take more than the server does",
                    max.get_ref()
                ),
            );
            ok = false;
        }
        plan.max_body = Some(*max.get_ref());
    }
    if let Some(limit) = &route.rate_limit {
        let l = limit.get_ref();
        let burst = l.burst.unwrap_or(l.per_second.saturating_mul(2).max(1));
        if l.per_second == 0 || burst == 0 {
            p.at(
                limit.span().start,
                "rate_limit: per_second and burst must be at least 1",
            );
            ok = false;
        }
        let (v4, v6) = (l.ipv4_prefix.unwrap_or(24), l.ipv6_prefix.unwrap_or(48));
        if v4 > 32 || v6 > 128 {
            p.at(
                limit.span().start,
                "rate_limit: ipv4_prefix is at most 32 and ipv6_prefix at most 128",
            );
            ok = false;
        }
        let queue = l.queue.unwrap_or(0);
        if queue > 0 && route.proxy.is_none() && route.fastcgi.is_none() {
            // Only a request on its way to an upstream is held (on the connection's timer);
            // an answer tern makes itself costs less to give than to hold.
            p.at(
                limit.span().start,
                "rate_limit: queue is for proxy and PHP (fastcgi) routes: only a request \
                 going to an app waits its turn",
            );
            ok = false;
        }
        if queue > 240 {
            p.at(limit.span().start, "rate_limit: queue is at most 240");
            ok = false;
        }
        let (exempt, exempt_loopback) = match &l.exempt {
            None => (Vec::new(), true),
            Some(list) => match tern_services::TrustedProxies::parse(list) {
                Ok(nets) => (nets.into_nets(), false),
                Err(e) => {
                    p.at(limit.span().start, format!("rate_limit: exempt: {e}"));
                    ok = false;
                    (Vec::new(), false)
                }
            },
        };
        let trusted_list = l
            .trusted_proxies
            .as_deref()
            .or(route.trusted_proxies.as_ref().map(|t| t.get_ref().as_str()));
        let trusted = match trusted_list.map(tern_services::TrustedProxies::parse) {
            None => tern_services::TrustedProxies::default(),
            Some(Ok(list)) => list,
            Some(Err(e)) => {
                p.at(
                    limit.span().start,
                    format!("rate_limit: trusted_proxies: {e}"),
                );
                ok = false;
                tern_services::TrustedProxies::default()
            }
        };
        plan.rate_limit = Some(tern_services::RateLimitConfig {
            per_second: l.per_second,
            burst,
            queue,
            ipv4_prefix: v4,
            ipv6_prefix: v6,
            exempt,
            exempt_loopback,
            trusted,
            buckets: ROUTE_RATE_BUCKETS,
        });
    }
    ok.then_some(plan)
}

/// `allow_encoded_slash`: the route is chosen and judged with `%2F` inside its segment,
/// while the upstream (or anything behind it) may decode it into a separator. That is one
/// view only if nothing beneath the route's prefix could decide otherwise on the decoded
/// path: no narrower route of the site, no path pattern on a route of its prefix, and no
/// gate (whose rules, in their own file, may name paths beneath it).
fn check_encoded_slash(routes: &[RouteFile], p: &mut Problems<'_>) {
    // The stored form the site table compares: canonical, decoded, no trailing slash.
    let stored = |r: &RouteFile| -> Option<Vec<u8>> {
        let canonical = tern_server::canonical_path(r.path.get_ref()).ok()?;
        let decoded = tern_server::decoded_path(&canonical);
        let mut d: &[u8] = &decoded;
        while let [rest @ .., b'/'] = d {
            d = rest;
        }
        Some(d.to_vec())
    };
    for route in routes {
        let Some(key) = &route.allow_encoded_slash else {
            continue;
        };
        if !*key.get_ref() {
            continue;
        }
        let at = key.span().start;
        let Some(mine) = stored(route) else {
            continue; // its path is refused on its own line
        };
        if route.gate.as_ref().is_some_and(|g| *g.get_ref()) {
            p.at(
                at,
                "allow_encoded_slash cannot go with gate = true: the gate's rules name paths                  an upstream that decodes %2F could read differently",
            );
        }
        for other in routes {
            let Some(theirs) = stored(other) else {
                continue;
            };
            let line = p.line(other.path.span().start);
            if theirs != mine && tern_server::path_under(&mine, &theirs) {
                p.at(
                    at,
                    format!(
                        "allow_encoded_slash: route {:?} (line {line}) lies beneath this one:                          a path with %2F decoded could be its, so the two cannot be told apart                          on one view of the path",
                        other.path.get_ref()
                    ),
                );
            } else if theirs == mine && (other.path_regex.is_some() || other.path_glob.is_some()) {
                p.at(
                    at,
                    format!(
                        "allow_encoded_slash: a path pattern on route {:?} (line {line}) could                          match a path with %2F decoded differently",
                        other.path.get_ref()
                    ),
                );
            }
        }
    }
}

/// Rewrites that lead back to themselves through literal targets (`/a` → `/b` → `/a`): each
/// would end in 500 at every request, so the file is refused.
fn check_loops(routes: &[(usize, RoutePlan)], p: &mut Problems<'_>) {
    // The route a literal path takes by its prefix (the first of the longest prefix: the
    // one a request without other distinguishing traits gets).
    let target_of = |path: &str| -> Option<usize> {
        let canonical = tern_server::canonical_path(path).ok()?;
        let mut best: Option<(usize, usize)> = None;
        for (i, (_, r)) in routes.iter().enumerate() {
            let stored = r.prefix.trim_end_matches('/');
            if tern_server::path_under(stored, canonical.as_ref())
                && best.is_none_or(|(_, len)| stored.len() > len)
            {
                best = Some((i, stored.len()));
            }
        }
        best.map(|(i, _)| i)
    };
    for (start, (line, route)) in routes.iter().enumerate() {
        let RouteKind::Rewrite(target) = &route.kind else {
            continue;
        };
        if target.contains('$') {
            continue;
        }
        let mut chain = vec![*line];
        let mut members = vec![start];
        let mut next = target_of(target);
        while let Some(i) = next {
            let (l, r) = &routes[i];
            let RouteKind::Rewrite(t) = &r.kind else {
                break;
            };
            if i == start {
                if members.iter().any(|&m| m < start) {
                    break; // reported from its first route
                }
                let lines: Vec<String> = chain.iter().map(|l| format!("line {l}")).collect();
                p.list.push(format!(
                    "line {line}: rewrite loop: {} -> line {line}: a request would be routed in \
                     circles",
                    lines.join(" -> ")
                ));
                break;
            }
            if chain.contains(l) || t.contains('$') {
                break;
            }
            chain.push(*l);
            members.push(i);
            next = target_of(t);
        }
    }
}

fn check_error_pages(
    site: &SiteFile,
    dir: &Path,
    p: &mut Problems<'_>,
) -> Vec<tern_vhost::ErrorPage> {
    let Some(pages) = &site.error_pages else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (code, file) in pages.get_ref() {
        let status = match code.parse::<u16>() {
            Ok(s) if (400..=599).contains(&s) => s,
            _ => {
                p.at(
                    pages.span().start,
                    format!("error_pages: {code:?} is not an error status (400-599)"),
                );
                continue;
            }
        };
        let path = dir.join(file.get_ref());
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() && m.len() <= MAX_ERROR_PAGE => match std::fs::read(&path) {
                Ok(body) => out.push(tern_vhost::ErrorPage {
                    status,
                    body: bytes::Bytes::from(body),
                    content_type: content_type_of(&path),
                }),
                Err(e) => p.at(
                    file.span().start,
                    format!("error page {}: {e}", path.display()),
                ),
            },
            Ok(m) if m.is_file() => p.at(
                file.span().start,
                format!(
                    "error page {} is over {MAX_ERROR_PAGE} bytes",
                    path.display()
                ),
            ),
            Ok(_) => p.at(
                file.span().start,
                format!("error page {} is not a file", path.display()),
            ),
            Err(e) => p.at(
                file.span().start,
                format!("error page {}: {e}", path.display()),
            ),
        }
    }
    out
}

fn content_type_of(path: &Path) -> String {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html" | "htm") => "text/html; charset=utf-8".into(),
        Some("txt") => "text/plain; charset=utf-8".into(),
        Some("json") => "application/json".into(),
        Some("xml") => "application/xml".into(),
        _ => "application/octet-stream".into(),
    }
}

fn check_request_ids(
    site: &SiteFile,
    p: &mut Problems<'_>,
) -> Option<tern_services::TrustedProxies> {
    let on = site.request_id.as_ref().is_some_and(|r| *r.get_ref());
    let trusted = match &site.request_id_trusted {
        None => tern_services::TrustedProxies::default(),
        Some(t) if !on => {
            p.at(t.span().start, "request_id_trusted needs request_id = true");
            return None;
        }
        Some(t) => match tern_services::TrustedProxies::parse(t.get_ref()) {
            Ok(list) => list,
            Err(e) => {
                p.at(t.span().start, format!("request_id_trusted: {e}"));
                return None;
            }
        },
    };
    on.then_some(trusted)
}

/// A route's `health_check` table; the checks send `proxy_host` as the Host, if given.
fn check_health(
    file: &HealthCheckFile,
    host: Option<&String>,
) -> Result<tern_proxy::HealthCheck, String> {
    let mut hc = tern_proxy::HealthCheck {
        host: host.cloned(),
        ..Default::default()
    };
    if let Some(path) = &file.path {
        if !path.starts_with('/') || path.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(format!(
                "path {path:?} must start with / and hold no spaces or control characters"
            ));
        }
        hc.path = path.clone();
    }
    for (key, value, to) in [
        ("interval", file.interval, &mut hc.interval),
        ("timeout", file.timeout, &mut hc.timeout),
    ] {
        if let Some(secs) = value {
            if secs == 0 {
                return Err(format!("{key} must be at least 1 (seconds)"));
            }
            *to = std::time::Duration::from_secs(secs);
        }
    }
    if hc.timeout > hc.interval {
        return Err("timeout must not be longer than interval".into());
    }
    for (key, value, to) in [
        ("rise", file.rise, &mut hc.rise),
        ("fall", file.fall, &mut hc.fall),
    ] {
        if let Some(n) = value {
            if n == 0 {
                return Err(format!("{key} must be at least 1 (checks in a row)"));
            }
            *to = n;
        }
    }
    if let Some(status) = &file.status {
        let (lo, hi) = status.split_once('-').unwrap_or((status, status));
        let code = |s: &str| {
            s.trim()
                .parse::<u16>()
                .ok()
                .filter(|c| (100..=599).contains(c))
        };
        match (code(lo), code(hi)) {
            (Some(lo), Some(hi)) if lo <= hi => hc.statuses = lo..=hi,
            _ => {
                return Err(format!(
                    "status {status:?}: give a status (\"204\") or a range (\"200-399\") from 100 to 599"
                ))
            }
        }
    }
    Ok(hc)
}

/// An upstream and its parameters, as nginx writes them after the address:
/// `"10.0.0.1:3000 weight=3"`, `"10.0.0.3:3000 backup"`.
/// A server, and its host when it is written `https://host:port` (TLS).
fn parse_server(
    s: &str,
    dir: &Path,
) -> Result<(tern_proxy::UpstreamServer, Option<String>), String> {
    let mut words = s.split_ascii_whitespace();
    let addr = words
        .next()
        .ok_or("give host:port, [v6]:port or unix:/path")?;
    let (addr, tls_host) = match addr.strip_prefix("https://") {
        Some(rest) => {
            let rest = rest.trim_end_matches('/');
            let host = match rest.rsplit_once(':') {
                Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
                _ => rest,
            };
            if host.is_empty() || rest.contains('/') {
                return Err("give https://host:port".into());
            }
            let with_port = if host.len() == rest.len() {
                format!("{rest}:443")
            } else {
                rest.to_string()
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            (parse_upstream(&with_port, dir)?, Some(host.to_string()))
        }
        None => (parse_upstream(addr, dir)?, None),
    };
    let mut server = tern_proxy::UpstreamServer::new(addr);
    for word in words {
        if word == "backup" {
            server.backup = true;
        } else if let Some(n) = word.strip_prefix("weight=") {
            server.weight = n
                .parse()
                .ok()
                .filter(|w| (1..=1000).contains(w))
                .ok_or_else(|| format!("weight {n:?}: give a whole number from 1 to 1000"))?;
        } else {
            return Err(format!(
                "unknown parameter {word:?}: after the address, use weight=N or backup"
            ));
        }
    }
    Ok((server, tls_host))
}

/// TLS to a route's upstreams: all its servers written `https://` or none, a name to verify
/// for each (its host, or `proxy_tls_server_name`; an IP address is verified against the
/// certificate's IP addresses), the CA and client-certificate files read now. False if
/// anything was refused.
fn check_upstream_tls(
    route: &RouteFile,
    dir: &Path,
    at: usize,
    tls_hosts: &[Option<String>],
    group: &mut tern_proxy::GroupOptions,
    p: &mut Problems<'_>,
) -> bool {
    let tls = tls_hosts.iter().filter(|h| h.is_some()).count();
    let keys = [
        ("proxy_tls_server_name", &route.proxy_tls_server_name),
        ("proxy_tls_ca", &route.proxy_tls_ca),
        ("proxy_tls_client_cert", &route.proxy_tls_client_cert),
        ("proxy_tls_client_key", &route.proxy_tls_client_key),
    ];
    if tls == 0 {
        let mut ok = true;
        for (key, value) in keys {
            if let Some(v) = value {
                p.at(
                    v.span().start,
                    format!("{key} needs TLS upstreams: write the servers https://host:port"),
                );
                ok = false;
            }
        }
        return ok;
    }
    if route.fastcgi.is_some() {
        p.at(
            at,
            "FastCGI servers are reached without TLS: give host:port",
        );
        return false;
    }
    if tls != tls_hosts.len() {
        p.at(
            at,
            "either every upstream of a route is https:// or none is",
        );
        return false;
    }
    let mut ok = true;
    let forced = route.proxy_tls_server_name.as_ref();
    for (server, host) in group.servers.iter_mut().zip(tls_hosts) {
        let name = forced.map_or(host.as_deref().unwrap_or(""), |n| n.get_ref().as_str());
        match rustls::pki_types::ServerName::try_from(name.to_string()) {
            Ok(n) => server.tls_name = Some(n),
            Err(_) => {
                let at = forced.map_or(at, |n| n.span().start);
                p.at(at, format!("{name:?} is not a DNS name or IP address to verify the upstream's certificate against"));
                ok = false;
            }
        }
    }
    let file = |v: &Option<Spanned<String>>| v.as_ref().map(|v| dir.join(v.get_ref()));
    let client_cert = match (&route.proxy_tls_client_cert, &route.proxy_tls_client_key) {
        (Some(cert), Some(key)) => Some(tern_tls::CertFiles {
            cert: dir.join(cert.get_ref()),
            key: dir.join(key.get_ref()),
        }),
        (None, None) => None,
        (Some(v), None) | (None, Some(v)) => {
            p.at(
                v.span().start,
                "proxy_tls_client_cert and proxy_tls_client_key go together",
            );
            return false;
        }
    };
    let options = tern_tls::upstream::UpstreamTlsOptions {
        ca: file(&route.proxy_tls_ca),
        client_cert,
    };
    match tern_tls::upstream::client_config(&options) {
        Ok(config) => group.tls = Some(config),
        Err(why) => {
            let at = [&route.proxy_tls_ca, &route.proxy_tls_client_cert]
                .into_iter()
                .flatten()
                .map(|v| v.span().start)
                .next()
                .unwrap_or(at);
            p.at(at, format!("upstream TLS: {why}"));
            ok = false;
        }
    }
    ok
}

/// `host:port` (a name is resolved now, once), `[v6]:port`, or `unix:/path` (relative paths
/// from the config's folder).
fn parse_upstream(s: &str, dir: &Path) -> Result<tern_server::UpstreamAddr, String> {
    use std::net::ToSocketAddrs;
    if let Some(path) = s.strip_prefix("unix:") {
        if path.is_empty() {
            return Err("a unix: upstream needs a socket path".into());
        }
        return Ok(tern_server::UpstreamAddr::Unix(dir.join(path)));
    }
    let s = s.strip_prefix("http://").unwrap_or(s).trim_end_matches('/');
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(tern_server::UpstreamAddr::Tcp(addr));
    }
    if !s.contains(':') {
        return Err("give host:port, [v6]:port or unix:/path".into());
    }
    match s.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .map(tern_server::UpstreamAddr::Tcp)
            .ok_or_else(|| "the name has no address".into()),
        Err(e) => Err(format!("cannot resolve: {e}")),
    }
}

/// `add_headers`, `remove_headers`, `headers_by_type` and `expires` (a site's or a route's),
/// checked; problems are recorded, bad entries left out.
fn check_headers(keys: HeaderKeys<'_>, p: &mut Problems<'_>) -> HeaderEdits {
    let (set, remove) = check_edits(
        ("add_headers", keys.add_headers),
        ("remove_headers", keys.remove_headers),
        p,
    );
    let mut edits = HeaderEdits {
        set: set.into_iter().map(|(n, v, _)| (n, v)).collect(),
        remove,
        ..HeaderEdits::default()
    };
    // A pattern is named once per key, whatever its case.
    let pattern_ok =
        |key: &str, pattern: &str, seen: &mut Vec<String>, at: usize, p: &mut Problems<'_>| {
            if let Err(e) = tern_vhost::check_type_pattern(pattern) {
                p.at(at, format!("{key}: {e}"));
                return false;
            }
            let lower = pattern.to_ascii_lowercase();
            if seen.contains(&lower) {
                p.at(at, format!("{key}: content type {pattern} is given twice"));
                return false;
            }
            seen.push(lower);
            true
        };
    if let Some(table) = keys.headers_by_type {
        let at = table.span().start;
        let mut seen = Vec::new();
        for (pattern, fields) in table.get_ref() {
            if !pattern_ok("headers_by_type", pattern, &mut seen, at, p) {
                continue;
            }
            let mut list = Vec::new();
            for (name, value) in fields {
                if let Some(why) = bad_field_name(name, false) {
                    p.at(at, format!("headers_by_type: {pattern}: {name:?} {why}"));
                    continue;
                }
                if value
                    .bytes()
                    .any(|b| (b.is_ascii_control() && b != b'\t') || b == 0x7f)
                {
                    p.at(
                        at,
                        format!("headers_by_type: {pattern}: the value of {name} must not hold control characters"),
                    );
                    continue;
                }
                match tern_vhost::check_header_value(value) {
                    Ok(t) if t.as_literal().is_some() => list.push((name.clone(), value.clone())),
                    Ok(_) => p.at(
                        at,
                        format!("headers_by_type: {pattern}: {name}: values by content type are literal (no $variables; $$ is a $)"),
                    ),
                    Err(e) => p.at(at, format!("headers_by_type: {pattern}: {name}: {e}")),
                }
            }
            edits.by_type.push((pattern.clone(), list));
        }
    }
    if let Some(table) = keys.expires {
        let at = table.span().start;
        let mut seen = Vec::new();
        for (pattern, value) in table.get_ref() {
            if !pattern_ok("expires", pattern, &mut seen, at, p) {
                continue;
            }
            let rule = match value {
                ExpiresValue::Secs(n) => tern_vhost::parse_expires(&n.to_string()),
                ExpiresValue::Text(t) => tern_vhost::parse_expires(t),
            };
            match rule {
                Ok(rule) => edits.expires.push((pattern.clone(), rule)),
                Err(e) => p.at(at, format!("expires: {pattern}: {e}")),
            }
        }
    }
    edits
}

/// A pair of set/remove keys: names, values without control characters, variables known.
#[allow(clippy::type_complexity)]
fn check_edits(
    (add_key, add): (&str, &Option<Spanned<BTreeMap<String, String>>>),
    (remove_key, remove): (&str, &Option<Spanned<Vec<String>>>),
    p: &mut Problems<'_>,
) -> (
    Vec<(String, String, tern_services::template::Template)>,
    Vec<String>,
) {
    let upstream = add_key == "add_request_headers";
    let mut set = Vec::new();
    let mut removed = Vec::new();
    if let Some(add) = add {
        for (name, value) in add.get_ref() {
            if let Some(why) = bad_field_name(name, upstream) {
                p.at(add.span().start, format!("{add_key}: {name:?} {why}"));
            } else if value
                .bytes()
                .any(|b| (b.is_ascii_control() && b != b'\t') || b == 0x7f)
            {
                p.at(
                    add.span().start,
                    format!("{add_key}: the value of {name} must not hold control characters"),
                );
            } else {
                match tern_vhost::check_header_value(value) {
                    Ok(t) => set.push((name.clone(), value.clone(), t)),
                    Err(e) => p.at(add.span().start, format!("{add_key}: {name}: {e}")),
                }
            }
        }
    }
    if let Some(remove) = remove {
        for name in remove.get_ref() {
            match bad_field_name(name, upstream) {
                Some(why) => p.at(remove.span().start, format!("{remove_key}: {name:?} {why}")),
                None => removed.push(name.clone()),
            }
        }
    }
    (set, removed)
}

/// Why a route may not edit this field (`upstream`: of the request an app gets).
fn bad_field_name(name: &str, upstream: bool) -> Option<&'static str> {
    if !tern_server::is_token(name.as_bytes()) {
        return Some("is not a header name");
    }
    let lower = name.to_ascii_lowercase();
    if upstream && lower == "host" {
        return Some("is set with proxy_host");
    }
    if upstream && lower.contains('_') {
        return Some(
            "has an underscore, which CGI-style apps read as a dash (tern drops such names)",
        );
    }
    CONNECTION_FIELDS
        .contains(&lower.as_str())
        .then_some("is written by the connection, not by a route")
}

impl RunConfig {
    /// The flags, with the file filling what they leave out (flags win, as for `tern serve`).
    pub fn common(&self, flags: &CommonArgs) -> CommonArgs {
        let f = &self.file;
        let get = |v: &Option<Spanned<u64>>| v.as_ref().map(|v| *v.get_ref());
        let mut c = flags.clone();
        c.listen = c.listen.or(f.listen);
        c.workers = c.workers.or(f.workers.as_ref().map(|v| *v.get_ref()));
        c.pin = c.pin || f.pin.unwrap_or(false);
        c.header_timeout = c.header_timeout.or(get(&f.header_timeout));
        c.body_timeout = c.body_timeout.or(get(&f.body_timeout));
        c.idle_timeout = c.idle_timeout.or(get(&f.idle_timeout));
        c.write_timeout = c.write_timeout.or(get(&f.write_timeout));
        c.max_body = c.max_body.or(f.max_body);
        c.max_connections = c
            .max_connections
            .or(f.max_connections.as_ref().map(|v| *v.get_ref()));
        c.shutdown_grace = c.shutdown_grace.or(f.shutdown_grace);
        c.access_log = c
            .access_log
            .or_else(|| f.access_log.as_ref().map(|p| self.dir.join(p)));
        c.access_log_format = c.access_log_format.or(f.access_log_format);
        c
    }

    /// Whether HTTP/2 clients are offered WebSockets (SETTINGS_ENABLE_CONNECT_PROTOCOL):
    /// `http2_websocket` when given, else when some route can relay one (a proxy route).
    pub fn http2_websocket(&self) -> bool {
        self.file.http2_websocket.unwrap_or_else(|| {
            self.sites
                .iter()
                .flat_map(|s| &s.routes)
                .any(|r| matches!(r.kind, RouteKind::Proxy(_)))
        })
    }

    /// HTTPS from `[tls]` (none without a certificate or `self_signed`).
    pub fn tls_plan(&self) -> Result<Option<TlsPlan>, String> {
        TlsArgs::default().plan(self.file.tls.as_ref(), &self.dir, None)
    }

    /// `[tls.acme]`: the helper's settings, the names from the sites' hosts unless the
    /// section lists its own; `None` without the section.
    pub fn acme(&self, plain_listener: bool) -> Result<Option<tern_acme::AcmeConfig>, String> {
        let file = self.file.tls.as_ref().and_then(|t| t.acme());
        if file.is_none() {
            return Ok(None);
        }
        let hosts: Vec<String> = self
            .sites
            .iter()
            .flat_map(|s| s.hosts.iter().cloned())
            .collect();
        crate::acme::resolve(
            &crate::acme::AcmeArgs::default(),
            file,
            &self.dir,
            &hosts,
            plain_listener,
        )
        .map_err(|e| format!("[tls.acme]: {e}"))
    }

    /// Every upstream of every proxy route (for the sandbox).
    pub fn upstreams(&self) -> Vec<tern_server::UpstreamAddr> {
        self.sites
            .iter()
            .flat_map(|s| &s.routes)
            .filter_map(|r| match &r.kind {
                RouteKind::Proxy(plan) | RouteKind::FastCgi { upstream: plan, .. } => Some(
                    plan.group
                        .servers
                        .iter()
                        .map(|s| s.addr.clone())
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// Files that TLS to upstreams reads, for every route.
    pub fn upstream_tls_files(&self) -> Vec<PathBuf> {
        self.sites
            .iter()
            .flat_map(|s| &s.routes)
            .filter_map(|r| match &r.kind {
                RouteKind::Proxy(plan) => Some(plan.tls_files.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    pub fn hardening(&self) -> FileHardening {
        FileHardening {
            user: self.file.user.clone(),
            group: self.file.group.clone(),
            sandbox: self.file.sandbox,
        }
    }

    /// The gateway's config file, resolved against the file's folder.
    pub fn gate(&self) -> Option<PathBuf> {
        self.file.gate.as_ref().map(|g| self.dir.join(g.get_ref()))
    }

    pub fn route_count(&self) -> usize {
        self.sites.iter().map(|s| s.routes.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder with `site/` (a static root) for the checks that look at the disk.
    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("site")).unwrap();
        std::fs::write(d.path().join("file.txt"), "x").unwrap();
        d
    }

    fn problems(text: &str) -> Vec<String> {
        let d = dir();
        parse(text, d.path()).unwrap_err()
    }

    const GOOD: &str = r#"
listen = "127.0.0.1:0"
workers = 2

[[site]]
name = "main"
hosts = ["Example.org", "www.example.org"]
default = true

[[site.route]]
path = "/"
static = "site"
cache_control = "public, max-age=60"
add_headers = { "Strict-Transport-Security" = "max-age=63072000", "Cache-Control" = "no-cache" }
remove_headers = ["ETag"]

[[site.route]]
path = "/old/"
redirect = "https://example.org/new"
status = 301
keep_path = false

[[site.route]]
path = "/health"
respond = "ok\n"

[[site]]
name = "wild"
hosts = ["*.example.org"]

[[site.route]]
path = "/"
redirect = "https://example.org"

[[site]]
name = "game"
hosts = ["games.test"]

[[site.route]]
path = "/"
app = "ipv4-games"
data = "data"
"#;

    #[test]
    fn a_good_file_becomes_a_plan() {
        let d = dir();
        let c = parse(GOOD, d.path()).unwrap();
        assert_eq!(c.sites.len(), 3);
        assert_eq!(c.route_count(), 5);
        assert_eq!(c.default_site, Some(0));
        assert_eq!(c.sites[0].hosts, ["example.org", "www.example.org"]);
        assert_eq!(c.sites[1].hosts, ["*.example.org"]);
        match &c.sites[0].routes[0].kind {
            RouteKind::Static(o) => {
                assert_eq!(o.root, d.path().join("site"));
                assert_eq!(o.cache_control.as_deref(), Some("public, max-age=60"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            c.sites[0].routes[0].headers.set,
            [
                ("Cache-Control".to_string(), "no-cache".to_string()),
                (
                    "Strict-Transport-Security".to_string(),
                    "max-age=63072000".to_string()
                )
            ]
        );
        assert_eq!(c.sites[0].routes[0].headers.remove, ["ETag"]);
        assert!(matches!(
            &c.sites[0].routes[1].kind,
            RouteKind::Redirect { status: 301, keep_path: false, target } if target == "https://example.org/new"
        ));
        assert!(matches!(
            &c.sites[0].routes[2].kind,
            RouteKind::Respond { status: 200, body, content_type } if body == "ok\n" && content_type.starts_with("text/plain")
        ));
        assert!(matches!(
            &c.sites[1].routes[0].kind,
            RouteKind::Redirect {
                status: 308,
                keep_path: true,
                ..
            }
        ));
        assert_eq!(
            c.app,
            Some(AppPlan {
                data: Some(d.path().join("data")),
                store: None,
                pages: tern_ipv4_games::bundled_site()
            })
        );
        let common = c.common(&CommonArgs::default());
        assert_eq!(common.workers, Some(2));
        assert_eq!(common.listen, Some("127.0.0.1:0".parse().unwrap()));
    }

    #[test]
    fn routes_are_labelled_by_name_or_path_and_bad_names_refused_with_their_line() {
        let d = dir();
        let ok = "[[site]]\nname = \"a\"\nhosts = [\"a.test\"]\n\
                  [[site.route]]\npath = \"/api\"\nmethods = [\"POST\"]\nrespond = \"y\"\nname = \"api.write:v2/x-y_z\"\n\
                  [[site.route]]\npath = \"/api/\"\nrespond = \"x\"\n\
                  [[site.route]]\npath = \"/\"\nrespond = \"z\"\n\
                  [[site]]\nname = \"b\"\nhosts = [\"b.test\"]\n\
                  [[site.route]]\npath = \"/\"\nrespond = \"z\"\nname = \"api.write:v2/x-y_z\"\n";
        let c = parse(ok, d.path()).unwrap();
        let labels: Vec<&str> = c.sites[0].routes.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            ["api.write:v2/x-y_z", "/api/", "/"],
            "or the path as written"
        );
        assert_eq!(
            c.sites[1].routes[0].label, "api.write:v2/x-y_z",
            "names are per site"
        );
        let route = |extra: &str| {
            format!(
                "[[site]]\nname = \"a\"\nhosts = [\"a.test\"]\n\
                 [[site.route]]\npath = \"/x\"\nrespond = \"x\"\nname = \"first\"\n\
                 [[site.route]]\npath = \"/\"\nrespond = \"y\"\n{extra}\n"
            )
        };
        let long = "n".repeat(65);
        for (extra, want) in [
            ("name = \"a b\"", "line 11: route name \"a b\" has ' '"),
            ("name = \"café\"", "line 11: route name \"café\" has 'é'"),
            (
                "name = \"a{x=\\\"\"",
                "line 11: route name \"a{x=\\\"\" has '{'",
            ),
            (
                "name = \"\"",
                "line 11: route name \"\" must be 1 to 64 characters",
            ),
            (&format!("name = \"{long}\""), "must be 1 to 64 characters"),
            (
                "name = \"_other\"",
                "line 11: route name \"_other\" is what /metrics calls",
            ),
            (
                "name = \"first\"",
                "line 11: route name \"first\" is the name of another route of this site (line 7)",
            ),
        ] {
            let e = problems(&route(extra));
            assert_eq!(e.len(), 1, "{extra}: {e:?}");
            assert!(
                e[0].starts_with(want) || e[0].contains(want),
                "{extra}: {e:?}"
            );
        }
        // A name that is an earlier unnamed route's path; a named route's path is free.
        let e = problems(&route("name = \"/x\"").replace("name = \"first\"\n", ""));
        assert_eq!(
            e,
            [
                "line 10: route name \"/x\" is the path of another route of this site (line 5): \
              their figures on /metrics would be one series; give one a name of its own"
            ]
        );
        parse(&route("name = \"/x\""), d.path()).unwrap();
        // An unnamed route whose path is an earlier route's name.
        let text = route("")
            .replace("name = \"first\"", "name = \"/y\"")
            .replace("path = \"/\"", "path = \"/y\"");
        assert_eq!(
            problems(&text),
            [
                "line 9: route path \"/y\" is the name of another route of this site (line 7): \
              their figures on /metrics would be one series; give one a name of its own"
            ]
        );
    }

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

    #[test]
    fn http2_websocket_is_on_by_default_only_with_a_proxy_route() {
        let d = dir();
        let offered = |top: &str, route: &str| {
            let text =
                format!("{top}[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\n{route}\n");
            parse(&text, d.path()).unwrap().http2_websocket()
        };
        assert!(offered("", "proxy = \"127.0.0.1:9\""));
        assert!(!offered("", "static = \"site\""));
        assert!(!offered(
            "http2_websocket = false\n",
            "proxy = \"127.0.0.1:9\""
        ));
        assert!(offered("http2_websocket = true\n", "static = \"site\""));
    }

    #[test]
    fn every_problem_is_listed_with_its_line() {
        let text = r#"[[site]]
name = "a"
hosts = ["a.test", "*example.org", "b.test:8080"]
default = true
[[site.route]]
path = "/"
static = "missing"
[[site.route]]
path = "app"
respond = "x"
[[site]]
name = "a"
hosts = ["A.test"]
default = true
[[site.route]]
path = "/r"
redirect = "https://a.test"
status = 200
[[site.route]]
path = "/r/"
respond = "gone"
status = 204
[[site.route]]
path = "/p"
proxy = "https://:3000"
[[site.route]]
path = "/s"
static = "site"
status = 200
[[site.route]]
path = "/h"
respond = "x"
add_headers = { "Content-Length" = "3", "X Bad" = "1" }
remove_headers = ["Date"]
[[site.route]]
path = "/two"
static = "site"
redirect = "/"
[[site]]
name = "lonely"
[[site]]
name = "file"
hosts = ["f.test"]
[[site.route]]
path = "/"
static = "file.txt"
"#;
        let e = problems(text);
        let want = [
            "line 3: host \"*example.org\" is a bad wildcard",
            "line 3: host \"b.test:8080\" names a port",
            "line 7: static root ",
            "line 9: path \"app\" must start with /",
            "line 12: site name \"a\" is already used (line 2)",
            "line 13: host a.test is already taken by site \"a\" (line 3)",
            "line 14: two default sites: \"a\" (line 4) and \"a\"",
            "line 18: status 200 is not a redirect",
            "line 20: path \"/r/\" is already routed on this site (line 16)",
            "line 22: status 204 has no body",
            "line 25: upstream \"https://:3000\": give https://host:port",
            "line 29: `status` does not apply to a static route",
            "line 33: add_headers: \"Content-Length\" is written by the connection",
            "line 33: add_headers: \"X Bad\" is not a header name",
            "line 34: remove_headers: \"Date\" is written by the connection",
            "line 38: a route has one kind, but both `static` and `redirect` are given",
            "line 40: site \"lonely\" has no hosts and is not the default",
            "line 40: site \"lonely\" has no [[site.route]]",
            "line 46: static root ",
        ];
        for w in want {
            assert!(
                e.iter().any(|p| p.starts_with(w)),
                "missing {w:?} in {e:#?}"
            );
        }
        assert_eq!(e.len(), want.len(), "{e:#?}");
        assert!(
            e.iter().any(|p| p.ends_with("file.txt is not a folder")),
            "{e:#?}"
        );
    }

    #[test]
    fn app_routes_are_checked() {
        let e = problems("[[site]]\nname = \"g\"\nhosts = [\"g.test\"]\n[[site.route]]\npath = \"/game\"\napp = \"ipv4-games\"\ndata = \"d\"\n");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("line 5: the app answers absolute paths"),
            "{e:?}"
        );
        let e = problems("[[site]]\nname = \"g\"\nhosts = [\"g.test\"]\n[[site.route]]\npath = \"/\"\napp = \"chess\"\n");
        assert!(e[0].starts_with("line 6: unknown app \"chess\""), "{e:?}");
        assert!(
            e[1].starts_with("line 6: an app route needs `data`"),
            "{e:?}"
        );
        let two = "[[site]]\nname = \"g\"\nhosts = [\"g.test\"]\n[[site.route]]\npath = \"/\"\napp = \"ipv4-games\"\ndata = \"d\"\n[[site]]\nname = \"h\"\nhosts = [\"h.test\"]\n[[site.route]]\npath = \"/\"\napp = \"ipv4-games\"\ndata = \"e\"\n";
        assert_eq!(
            problems(two),
            ["line 13: at most one app route: the IPv4 Games runs once per server (line 6)"]
        );
    }

    #[test]
    fn server_keys_are_checked_and_flags_win() {
        let e = problems("workers = 0\nidle_timeout = 0\n[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\nrespond = \"\"\n");
        assert_eq!(
            e,
            [
                "line 2: idle_timeout must be at least 1 (seconds)",
                "line 1: workers must be at least 1"
            ]
        );
        assert_eq!(
            problems(""),
            ["no [[site]]: the file serves nothing (see examples/tern.toml)"]
        );
        let d = dir();
        let c = parse(
            "workers = 3\nidle_timeout = 9\n[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\nrespond = \"\"\n",
            d.path(),
        )
        .unwrap();
        let flags = CommonArgs {
            workers: Some(1),
            ..CommonArgs::default()
        };
        let merged = c.common(&flags);
        assert_eq!(merged.workers, Some(1));
        assert_eq!(merged.idle_timeout, Some(9));
        assert_eq!(c.default_site, Some(0));
    }

    #[test]
    fn routing_keys_become_a_plan() {
        let d = dir();
        std::fs::write(d.path().join("404.html"), "<h1>lost</h1>").unwrap();
        let text = r#"
[[site]]
name = "app"
default = true
request_id = true
request_id_trusted = "10.0.0.0/8"
error_pages = { 404 = "404.html" }

[[site.route]]
path = "/"
static = "site"
try_files = ["$uri", "$uri/index.html", "/index.html"]
add_headers = { "X-Request-Id" = "$request_id" }

[[site.route]]
path = "/api"
proxy = "127.0.0.1:9"
strip_prefix = true
max_body = 10000000
rate_limit = { per_second = 5, burst = 10 }
add_request_headers = { "X-Real-IP" = "$client", "X-Scheme" = "$scheme" }
remove_request_headers = ["Cookie"]

[[site.route]]
path = "/u"
path_regex = "^/u/([0-9]+)$"
methods = ["GET"]
match_headers = { "Accept" = "*" }
match_query = { "v" = "2" }
match_headers_regex = { "User-Agent" = '(?i)^DavClnt.*$' }
rewrite = "/api/users/$1"
"#;
        let c = parse(text, d.path()).unwrap();
        assert_eq!(
            c.sites[0].routes[2].options.matchers.header_patterns,
            [("User-Agent".to_string(), "(?i)^DavClnt.*$".to_string())]
        );
        let site = &c.sites[0];
        assert!(site.request_ids.is_some());
        assert_eq!(site.error_pages[0].status, 404);
        assert_eq!(site.error_pages[0].content_type, "text/html; charset=utf-8");
        assert_eq!(site.routes[0].options.try_files.len(), 3);
        let api = &site.routes[1];
        assert!(api.options.strip_prefix);
        assert_eq!(api.options.max_body, Some(10_000_000));
        assert_eq!(api.options.rate_limit.as_ref().unwrap().burst, 10);
        match &api.kind {
            RouteKind::Proxy(plan) => {
                assert_eq!(plan.options.request_headers.set.len(), 2);
                assert_eq!(plan.options.request_headers.remove, ["Cookie"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&site.routes[2].kind, RouteKind::Rewrite(t) if t == "/api/users/$1"));
        assert_eq!(site.routes[2].options.matchers.methods, ["GET"]);
    }

    #[test]
    fn routing_keys_are_refused_with_their_lines() {
        let text = r#"[[site]]
name = "a"
default = true
error_pages = { 200 = "x.html", 500 = "missing.html" }
request_id_trusted = "10.0.0.0/8"
[[site.route]]
path = "/"
static = "site"
try_files = ["$uri", "$uri"]
add_headers = { "X-Id" = "$request_id", "X-Bad" = "$remote_addr" }
max_body = 99999999
[[site.route]]
path = "/p"
proxy = "127.0.0.1:9"
path_regex = "/p/.*"
add_request_headers = { "Host" = "x" }
rate_limit = { per_second = 0 }
[[site.route]]
path = "/r"
respond = "x"
strip_prefix = true
[[site.route]]
path = "/a"
rewrite = "/b"
[[site.route]]
path = "/b"
rewrite = "/a/x"
[[site.route]]
path = "/m"
methods = ["get"]
respond = "x"
[[site.route]]
path = "/m"
respond = "y"
[[site.route]]
path = "/m"
respond = "z"
[[site.route]]
path = "/c"
rewrite = "/c/$2"
path_regex = "^/c/(.*)$"
[[site.route]]
path = "/h"
respond = "x"
match_headers_regex = { "User-Agent" = "DavClnt" }
"#;
        let e = problems(text);
        let want = [
            "line 4: error_pages: \"200\" is not an error status",
            "line 4: error page ",
            "line 5: request_id_trusted needs request_id = true",
            "line 9: try_files fallback \"$uri\" routes the request to itself",
            "line 10: add_headers: X-Bad: \"$remote_addr\": unknown variable $remote_addr",
            "line 10: add_headers: $request_id needs request_id = true",
            "line 11: max_body 99999999 is above the server's max_body",
            "line 15: path_regex \"/p/.*\" must be anchored",
            "line 16: add_request_headers: \"Host\" is set with proxy_host",
            "line 17: rate_limit: per_second and burst must be at least 1",
            "line 21: `strip_prefix` does not apply to a respond route",
            "line 23: rewrite loop: line 23 -> line 26 -> line 23",
            "line 30: method \"get\" is not an upper-case method token",
            "line 36: path \"/m\" is already routed on this site (line 33) by a route with no other matcher",
            "line 40: rewrite: \"/c/$2\": $2 names no group",
            "line 45: match_headers_regex: the pattern of header User-Agent \"DavClnt\" must be anchored",
        ];
        for w in want {
            assert!(
                e.iter().any(|p| p.starts_with(w)),
                "missing {w:?} in {e:#?}"
            );
        }
        assert_eq!(e.len(), want.len(), "{e:#?}");
    }

    #[test]
    fn rate_limit_queue_exempt_and_trusted_proxies_become_a_plan_or_are_refused() {
        let good = r#"[[site]]
name = "a"
default = true
[[site.route]]
path = "/login"
proxy = "127.0.0.1:9"
trusted_proxies = "10.0.0.0/8"
rate_limit = { per_second = 5, burst = 1, queue = 10, exempt = "" }
[[site.route]]
path = "/api"
proxy = "127.0.0.1:9"
rate_limit = { per_second = 5, exempt = "192.0.2.0/24", trusted_proxies = "127.0.0.1" }
[[site.route]]
path = "/"
static = "site"
rate_limit = { per_second = 5 }
"#;
        let d = dir();
        let c = parse(good, d.path()).unwrap();
        let limit = |i: usize| c.sites[0].routes[i].options.rate_limit.clone().unwrap();
        let login = limit(0);
        assert_eq!((login.queue, login.exempt_loopback), (10, false));
        assert!(login.exempt.is_empty());
        // The route's trusted proxies are the limit's unless it names its own.
        assert!(login.trusted.is_trusted("10.1.2.3".parse().unwrap()));
        let api = limit(1);
        assert_eq!((api.queue, api.exempt_loopback), (0, false));
        assert_eq!(
            api.exempt,
            ["192.0.2.0/24".parse::<ipnet::IpNet>().unwrap()]
        );
        assert!(api.trusted.is_trusted("127.0.0.1".parse().unwrap()));
        let files = limit(2);
        assert!(files.exempt_loopback && files.trusted.is_empty());

        let bad = r#"[[site]]
name = "a"
default = true
[[site.route]]
path = "/"
static = "site"
rate_limit = { per_second = 5, queue = 3 }
[[site.route]]
path = "/p"
proxy = "127.0.0.1:9"
rate_limit = { per_second = 5, queue = 241, exempt = "nowhere" }
[[site.route]]
path = "/q"
proxy = "127.0.0.1:9"
rate_limit = { per_second = 5, trusted_proxies = "a proxy" }
"#;
        let e = problems(bad);
        let want = [
            "line 7: rate_limit: queue is for proxy and PHP (fastcgi) routes",
            "line 11: rate_limit: queue is at most 240",
            "line 11: rate_limit: exempt: not an address or CIDR: \"nowhere\"",
            "line 15: rate_limit: trusted_proxies: not an address or CIDR: \"a proxy\"",
        ];
        for w in want {
            assert!(
                e.iter().any(|p| p.starts_with(w)),
                "missing {w:?} in {e:#?}"
            );
        }
        assert_eq!(e.len(), want.len(), "{e:#?}");
    }

    #[test]
    fn header_keys_of_sites_and_routes_become_a_plan_or_are_refused() {
        let good = r#"[[site]]
name = "a"
default = true
add_headers = { X-Frame-Options = "DENY" }
remove_headers = ["X-Powered-By"]
headers_by_type = { "text/html" = { Content-Security-Policy = "default-src 'self'" } }
expires = { "text/html" = "epoch", "image/*" = "30d", "font/woff2" = 3600, "*" = "off" }
[[site.route]]
path = "/"
static = "site"
expires = { "image/svg+xml" = "max" }
"#;
        let d = dir();
        let c = parse(good, d.path()).unwrap();
        let site = &c.sites[0].headers;
        assert_eq!(site.set, [("X-Frame-Options".into(), "DENY".into())]);
        assert_eq!(site.remove, ["X-Powered-By"]);
        assert_eq!(site.by_type[0].0, "text/html");
        let rules: Vec<(&str, tern_vhost::Expires)> =
            site.expires.iter().map(|(p, e)| (p.as_str(), *e)).collect();
        assert_eq!(
            rules,
            [
                ("*", tern_vhost::Expires::Off),
                ("font/woff2", tern_vhost::Expires::After(3600)),
                ("image/*", tern_vhost::Expires::After(30 * 86_400)),
                ("text/html", tern_vhost::Expires::Epoch),
            ]
        );
        assert_eq!(
            c.sites[0].routes[0].headers.expires,
            [("image/svg+xml".into(), tern_vhost::Expires::Max)]
        );
        let bad = r#"[[site]]
name = "a"
default = true
add_headers = { X-Id = "$request_id", Date = "x" }
headers_by_type = { "text" = { X = "1" }, "text/html" = { X-Host = "$host", Server = "x" } }
expires = { "image/*" = "1d", "Image/*" = "2d", "text/css" = "20y", "text/js" = "forever" }
[[site.route]]
path = "/"
static = "site"
expires = { "text/html; charset=utf-8" = "max" }
headers_by_type = { "*" = { X-Ok = "1" }, "*/*" = { X = "1" } }
"#;
        let e = problems(bad);
        let want = [
            "line 4: add_headers: \"Date\" is written by the connection",
            "line 4: add_headers: $request_id needs request_id = true",
            "line 5: headers_by_type: content type \"text\": give \"type/subtype\"",
            "line 5: headers_by_type: text/html: X-Host: values by content type are literal",
            "line 5: headers_by_type: text/html: \"Server\" is written by the connection",
            "line 6: expires: content type image/* is given twice",
            "line 6: expires: text/js: expires \"forever\": give \"off\"",
            "line 6: expires: text/css: expires \"20y\" is longer than ten years",
            "line 10: expires: content type \"text/html; charset=utf-8\": give",
            "line 11: headers_by_type: content type \"*/*\": give",
        ];
        for w in want {
            assert!(
                e.iter().any(|p| p.starts_with(w)),
                "missing {w:?} in {e:#?}"
            );
        }
        assert_eq!(e.len(), want.len(), "{e:#?}");
    }

    #[test]
    fn redirect_http_keys_are_checked_with_their_lines() {
        let text = r#"[tls]
self_signed = true
redirect_http = "127.0.0.1:0"
redirect_http_status = 301
redirect_http_hosts = { "www.example.com" = "example.com", "*" = "example.com:8443" }
[[site]]
name = "a"
default = true
[[site.route]]
path = "/"
respond = "x"
"#;
        let d = dir();
        let c = parse(text, d.path()).unwrap();
        let plan = c.tls_plan().unwrap().unwrap();
        assert_eq!(plan.redirect.status, 301);
        assert_eq!(
            plan.redirect.hosts,
            [("www.example.com".to_string(), "example.com".to_string())]
        );
        assert_eq!(
            plan.redirect.target_for("WWW.example.com."),
            Some("example.com")
        );
        assert_eq!(
            plan.redirect.target_for("other.test"),
            Some("example.com:8443")
        );
        let bad = r#"[tls]
self_signed = true
redirect_http_status = 200
redirect_http_hosts = { "*.example.com" = "example.com", "a.test" = "b.test/x", "c.test" = "c.test:0" }
[[site]]
name = "a"
default = true
[[site.route]]
path = "/"
respond = "x"
"#;
        let e = problems(bad);
        let want = [
            "line 3: [tls] redirect_http_status 200 is not a redirect",
            "line 4: [tls] redirect_http_hosts: \"*.example.com\" is not a host name",
            "line 4: [tls] redirect_http_hosts: \"b.test/x\" is not a host name",
            "line 4: [tls] redirect_http_hosts: \"c.test:0\" is not a host name",
            "line 3: [tls] redirect_http_status and redirect_http_hosts need redirect_http",
        ];
        for w in want {
            assert!(
                e.iter().any(|p| p.starts_with(w)),
                "missing {w:?} in {e:#?}"
            );
        }
        assert_eq!(e.len(), want.len(), "{e:#?}");
    }

    fn proxy_plan(c: &RunConfig) -> &ProxyPlan {
        match &c.sites[0].routes[0].kind {
            RouteKind::Proxy(plan) => plan,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn upstream_weights_and_backups_become_a_plan_or_are_refused() {
        let d = dir();
        let route = "[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\n";
        let c = parse(
            &format!("{route}proxy = [\"127.0.0.1:3000 weight=3\", \"127.0.0.1:3001\", \"127.0.0.1:3002  backup \"]\n"),
            d.path(),
        )
        .unwrap();
        let servers = &proxy_plan(&c).group.servers;
        assert_eq!(
            servers
                .iter()
                .map(|s| (s.weight, s.backup))
                .collect::<Vec<_>>(),
            [(3, false), (1, false), (1, true)]
        );
        assert_eq!(servers[2].addr.to_string(), "127.0.0.1:3002");
        let e = problems(&format!(
            "{route}proxy = [\"127.0.0.1:3000 weight=0\", \"127.0.0.1:3001 down\"]\n"
        ));
        assert_eq!(
            e,
            [
                "line 6: upstream \"127.0.0.1:3000 weight=0\": weight \"0\": give a whole number from 1 to 1000",
                "line 6: upstream \"127.0.0.1:3001 down\": unknown parameter \"down\": after the address, use weight=N or backup",
            ]
        );
        let e = problems(&format!("{route}proxy = \"127.0.0.1:3000 backup\"\n"));
        assert_eq!(
            e,
            ["line 6: every upstream is a backup: at least one must not be"]
        );
    }

    #[test]
    fn retry_keys_become_a_policy_or_are_refused() {
        let d = dir();
        let route = "[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\nproxy = [\"127.0.0.1:3000\", \"127.0.0.1:3001\"]\n";
        let c = parse(
            &format!("{route}retries = 1\nretry_budget = 3\nretry_on_status = [502, 504]\n"),
            d.path(),
        )
        .unwrap();
        let retry = proxy_plan(&c).group.retry;
        assert_eq!(retry.retries, 1);
        assert_eq!(retry.budget, Some(std::time::Duration::from_secs(3)));
        assert!(retry.retries_on(502) && retry.retries_on(504) && !retry.retries_on(503));
        let e = problems(&format!(
            "{route}retry_budget = 0\nretry_on_status = [500, 503]\n"
        ));
        assert_eq!(
            e,
            [
                "line 7: retry_budget must be at least 1 (seconds)",
                "line 8: retry_on_status: 500 is not retried (only 502, 503 and 504 are)",
            ]
        );
        let e = problems("[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\nrespond = \"x\"\nretries = 2\n");
        assert_eq!(e, ["line 7: `retries` does not apply to a respond route"]);
    }

    #[test]
    fn health_checks_become_a_plan_or_are_refused() {
        let d = dir();
        let route = "[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\nproxy = \"127.0.0.1:3000\"\nproxy_host = \"app.internal\"\n";
        let c = parse(
            &format!("{route}health_check = {{ path = \"/healthz\", interval = 3, status = \"204\", fall = 1 }}\n"),
            d.path(),
        )
        .unwrap();
        let hc = proxy_plan(&c).group.health_check.clone().unwrap();
        assert_eq!(
            hc,
            tern_proxy::HealthCheck {
                path: "/healthz".into(),
                host: Some("app.internal".into()),
                interval: std::time::Duration::from_secs(3),
                timeout: std::time::Duration::from_secs(2),
                statuses: 204..=204,
                rise: 2,
                fall: 1,
            }
        );
        for (table, why) in [
            ("{ path = \"health\" }", "health_check: path \"health\" must start with / and hold no spaces or control characters"),
            ("{ interval = 0 }", "health_check: interval must be at least 1 (seconds)"),
            ("{ interval = 1, timeout = 3 }", "health_check: timeout must not be longer than interval"),
            ("{ rise = 0 }", "health_check: rise must be at least 1 (checks in a row)"),
            ("{ status = \"300-200\" }", "health_check: status \"300-200\": give a status (\"204\") or a range (\"200-399\") from 100 to 599"),
        ] {
            let e = problems(&format!("{route}health_check = {table}\n"));
            assert_eq!(e, [format!("line 8: {why}")], "{table}");
        }
        let e = problems(&format!("{route}health_check = {{ url = \"/\" }}\n"));
        assert_eq!(e, ["line 8: unknown key \"url\""]);
    }
}
