//! The checked plan a file becomes: sites, their routes and each route's kind, which
//! `run/mod.rs` turns into the site table; and what the file says of the server.

use std::path::PathBuf;

use tern_server::static_files::StaticOptions;
use tern_vhost::HeaderEdits;

use super::file::RunFile;
use crate::common::{CommonArgs, LogFormatArg};
use crate::hardening::FileHardening;
use crate::tls::{TlsArgs, TlsPlan};

/// A checked file, paths resolved against its folder.
#[derive(Debug)]
pub struct RunConfig {
    pub(super) file: RunFile,
    /// The folder relative paths are taken from.
    pub(super) dir: PathBuf,
    pub sites: Vec<SitePlan>,
    /// Index into `sites` of the site for unknown hosts; `None`: they get 421.
    pub default_site: Option<usize>,
    pub app: Option<AppPlan>,
    /// The control socket's group (`control_group`), not yet looked up.
    pub control_group: Option<ControlGroupPlan>,
}

/// `control_group` as written, and its line (the start-up's lookup names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlGroupPlan {
    pub name: String,
    pub line: usize,
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
    /// A shared cache in front of the app (proxy and PHP routes).
    pub cache: Option<super::cache::CachePlan>,
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
    /// Only for requests tern routes again itself.
    pub internal: bool,
    /// The app's `X-Accel-Redirect` is followed (proxy and PHP routes).
    pub x_accel_redirect: bool,
    /// The app's answers with these statuses are answered by a path (proxy and PHP routes).
    pub reroute_status: Vec<(u16, String)>,
}

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

impl RunConfig {
    /// The flags, with the file filling what they leave out (flags win, as for `tern serve`).
    pub fn common(&self, flags: &CommonArgs) -> CommonArgs {
        self.file.server_keys().under(flags, &self.dir)
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
        TlsArgs::default().plan(self.file.server_keys().tls.as_ref(), &self.dir, None)
    }

    /// `[tls.acme]`: the helper's settings, the names from the sites' hosts unless the
    /// section lists its own; `None` without the section.
    pub fn acme(&self, plain_listener: bool) -> Result<Option<tern_acme::AcmeConfig>, String> {
        let file = self.file.server_keys().tls.as_ref().and_then(|t| t.acme());
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
        self.file.server_keys().hardening()
    }

    /// The gateway's config file, resolved against the file's folder.
    pub fn gate(&self) -> Option<PathBuf> {
        self.file.gate.as_ref().map(|g| self.dir.join(g.get_ref()))
    }

    /// The control socket's path (`control`), if the file names one.
    pub fn control(&self) -> Option<PathBuf> {
        self.file
            .control
            .as_ref()
            .map(|c| self.dir.join(c.get_ref()))
    }

    pub fn route_count(&self) -> usize {
        self.sites.iter().map(|s| s.routes.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse, testing::dir};

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
}
