//! `tern run --config FILE`: several sites from one file (`config/` reads and checks it).
//!
//! Start-up turns the file into listeners (plain, HTTPS with a certificate per SNI name, the
//! redirect to HTTPS: the `[tls]` machinery of `tern serve`), at most one IPv4 Games instance,
//! and a `tern_vhost::SiteTable` behind the router's fallback. `SIGHUP` re-reads the file,
//! builds a whole new table (static roots re-opened) and swaps it in at once; open
//! connections keep going. What needs a restart (listeners, workers, pinning, the sockets'
//! backend, the shutdown grace, HTTPS on or off, the app's folders, user and sandbox) is
//! reported, not applied. A bad file, or an upstream outside what the sandbox allowed at
//! start-up, changes nothing and logs one line.

mod config;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use tern_server::static_files::StaticFiles;
use tern_server::{Handler, LogTarget, Router, Server, ServerConfig, TlsAcceptor, TlsOptions};
use tern_vhost::{Action, Fixed, Redirect, Route, RouteOptions, Site, SiteTable, Sites};

use crate::common::{
    run_server_with_reload, CommonArgs, LogFormatArg, OnReload, ReloadOutcome, ReloadTrigger,
    ServerReload,
};
use crate::hardening::{self, FileHardening, Needs};
use crate::tls::TlsPlan;
use config::{AppPlan, RouteKind, RunConfig, SiteLog};

#[derive(Args)]
#[command(
    override_usage = "tern run --config <FILE> [OPTIONS]\n       tern run --check --config <FILE>"
)]
pub struct RunArgs {
    /// The sites file (TOML; see examples/tern.toml); re-read on SIGHUP. Flags win over the
    /// server settings in it.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Check the file and print its problems with their line numbers, then exit (non-zero
    /// when there are problems) without serving.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    common: CommonArgs,
}

pub fn run(args: RunArgs) -> Result<(), String> {
    if args.check {
        return check(&args);
    }
    let loaded = config::load(&args.config).map_err(|problems| problems.join("\n"))?;
    let tls = loaded.tls_plan()?;
    let acceptor = tls.as_ref().map(crate::tls::acceptor).transpose()?;
    let common = loaded.common(&args.common);
    let mut server_config = listeners(&common, tls.as_ref());
    server_config.http2_websocket = loaded.http2_websocket();
    // `%2F` is judged by the site's routes (400 wherever no `allow_encoded_slash` takes it)
    // and by the router, which refuses it on its own routes: so a reload may add the key.
    server_config.limits.allow_encoded_slash = true;
    let started = Started::new(&loaded, &server_config, tls.is_some());
    crate::service::adopt_inherited_sockets(&mut server_config)?;
    let mut needs = needs(&args.config, &loaded, tls.as_ref());
    let workers = server_config.runtime.workers;
    let gate = crate::gate::open_guard(
        loaded.gate().as_deref(),
        workers,
        &args.common.hardening,
        Some(&loaded.hardening()),
        &mut needs,
    )?;
    let logs = log_plan(&loaded, &common)?;
    let mut opened_logs = Vec::with_capacity(logs.files.len());
    for (path, format) in &logs.files {
        opened_logs.push(crate::common::open_access_log(path, *format, &mut needs)?);
    }
    let plain_listener =
        common.listen.is_some() || tls.as_ref().is_some_and(|t| t.redirect_http.is_some());
    let acme = match (loaded.acme(plain_listener)?, &acceptor) {
        (Some(config), Some(acceptor)) => Some(crate::acme::start(
            &config,
            acceptor.clone(),
            &args.common.hardening,
            Some(&loaded.hardening()),
        )?),
        _ => None,
    };
    // Before privileges are dropped and the sandbox is on: it makes a file (and a group
    // other than tern's own may be given only while tern can).
    let control_group = control_group(&args.config, &loaded)?;
    let control = loaded
        .control()
        .map(|p| crate::control::bind(&p, control_group.as_ref()))
        .transpose()?;
    let lockdown = hardening::plan(&args.common.hardening, Some(&loaded.hardening()), needs)?;
    let sandbox_connect =
        (lockdown.mode != tern_sandbox::Mode::Off).then(|| lockdown.paths.connect.clone());
    let mut server = Server::new(server_config, Router::new());
    let stats = server.stats();
    let app: Option<Arc<dyn Handler>> = match &loaded.app {
        Some(plan) => {
            let mut game = tern_ipv4_games::GameConfig::new(
                plan.data.clone().unwrap_or_default(),
                &plan.pages,
            );
            game.store = plan.store.clone();
            Some(Arc::new(tern_ipv4_games::mount(&mut server, game)?))
        }
        None => None,
    };
    let table = build_table(
        &loaded,
        app.as_ref(),
        gate.as_ref(),
        workers,
        &logs.targets,
        &stats,
    )?;
    let what = format!(
        "running {} from {}",
        describe_table(&table),
        args.config.display()
    );
    let sites = Sites::new(table);
    let mut router = Router::new().fallback(sites.clone());
    if args.common.hardening.probes() {
        router = hardening::probe_routes(router);
    }
    *server.router_mut() = router;
    let lockdown = hardening::lockdown_step(lockdown);
    let mut server = server.after_bind(move |backend| {
        lockdown(backend)?;
        // Sandboxed first: the checker thread inherits it.
        tern_proxy::health::start()
    });
    if let Some(gate) = &gate {
        server = gate.install(server);
    }
    let mut server = common.install_bans(server, &[])?;
    // The control socket's `reload` runs on the signal thread, as SIGHUP's does.
    let (reload_requester, reload_queue) = crate::common::reload_queue()?;
    if let Some(control) = control {
        server.background("control", move |stop| {
            control.serve(&reload_requester, stop)
        });
    }
    if !opened_logs.is_empty() {
        server = server.with_access_logs(opened_logs);
    }
    if let Some(acceptor) = &acceptor {
        server = server.with_tls(acceptor.clone());
    }
    let (acme_receiver, acme_loop) = acme.unzip();
    if let Some(receive) = acme_loop {
        crate::acme::install(&mut server, receive);
    }
    let mut reloader = Reloader {
        path: args.config,
        flags: args.common,
        started,
        app,
        sites,
        acceptor: acceptor.clone(),
        gate,
        workers,
        log_files: logs.files,
        stats: stats.clone(),
        sandbox_connect,
    };
    let on_reload: OnReload = Box::new(move |server: ServerReload<'_>, trigger| {
        if let Some(acme) = &acme_receiver {
            acme.check_now();
        }
        reloader.reload(server, trigger)
    });
    run_server_with_reload(
        server,
        &what,
        on_reload,
        acceptor.as_deref(),
        Some(reload_queue),
    )
}

/// `--check`: the problems on stderr, one a line, or a one-line summary on stdout.
fn check(args: &RunArgs) -> Result<(), String> {
    let path = args.config.display();
    let loaded = match config::load(&args.config) {
        Ok(loaded) => loaded,
        Err(problems) => {
            for p in &problems {
                eprintln!("{p}");
            }
            let n = problems.len();
            return Err(format!(
                "{path}: {n} problem{}",
                if n == 1 { "" } else { "s" }
            ));
        }
    };
    let tls = loaded
        .tls_plan()
        .map_err(|e| format!("config {path}: [tls]: {e}"))?;
    if let Some(plan) = &tls {
        // Loads every certificate and key as start-up would, without touching the ticket-key
        // file (a check writes nothing).
        let options = TlsOptions {
            ticket_keys: None,
            ..plan.options.clone()
        };
        TlsAcceptor::new(&options).map_err(|e| format!("config {path}: [tls]: {e}"))?;
    }
    let common = loaded.common(&args.common);
    let plain_listener =
        common.listen.is_some() || tls.as_ref().is_some_and(|t| t.redirect_http.is_some());
    loaded
        .acme(plain_listener)
        .map_err(|e| format!("config {path}: {e}"))?;
    control_group(&args.config, &loaded)?;
    let server_config = listeners(&common, tls.as_ref());
    let sites = loaded.sites.len();
    let default = match loaded.default_site {
        Some(i) => format!("default site {:?}", loaded.sites[i].name),
        None => "unknown hosts get 421".to_string(),
    };
    println!(
        "config {path}: ok: {sites} site{}, {} route{}, {default}; listening on {}",
        if sites == 1 { "" } else { "s" },
        loaded.route_count(),
        if loaded.route_count() == 1 { "" } else { "s" },
        crate::tls::describe_listeners(
            &server_config.runtime.listen,
            &server_config.listener_kinds
        )
    );
    Ok(())
}

/// The control socket's group (`control_group`), looked up; an unknown one is an error naming
/// the file and line.
fn control_group(
    path: &Path,
    loaded: &RunConfig,
) -> Result<Option<crate::control::ControlGroup>, String> {
    let Some(plan) = &loaded.control_group else {
        return Ok(None);
    };
    crate::control::ControlGroup::lookup(&plan.name)
        .map(Some)
        .map_err(|e| {
            format!(
                "config {}: line {}: control_group: {e}",
                path.display(),
                plan.line
            )
        })
}

/// The server settings and listeners: plain HTTP (with HTTPS on, only when `listen` is
/// given), HTTPS, and the redirect listener.
fn listeners(common: &CommonArgs, tls: Option<&TlsPlan>) -> ServerConfig {
    let mut config = common.server_config();
    let plain = config.runtime.listen[0];
    crate::tls::configure(&mut config, plain, common.listen.is_some(), tls);
    config
}

/// What the process keeps needing from the file system and the network: the config file's
/// folder, every static root's folder (deploys swap roots beside each other; see
/// [`hardening::beside`]), the app's data (write) and pages, the certificates, and the
/// upstreams' ports and socket folders.
fn needs(path: &Path, loaded: &RunConfig, tls: Option<&TlsPlan>) -> Needs {
    let mut needs = Needs::default();
    needs.read_file(path);
    for site in &loaded.sites {
        for route in &site.routes {
            if let RouteKind::Static(options) | RouteKind::FastCgi { files: options, .. } =
                &route.kind
            {
                let root = std::fs::canonicalize(&options.root).unwrap_or(options.root.clone());
                needs.read.push(hardening::beside(&root));
            }
        }
    }
    if let Some(app) = &loaded.app {
        needs.read.push(app.pages.clone());
        if let Some(data) = &app.data {
            needs.write.push(data.clone());
            needs.give.push(tern_sandbox::Give::Folder {
                path: data.clone(),
                made_by_tern: tern_ipv4_games::DATA_FILE_PREFIXES
                    .iter()
                    .map(|p| p.to_string())
                    .collect(),
            });
        }
        if let Some(url) = &app.store {
            // Checked when the file was read.
            let _ = needs.connect_to_store(url);
        }
    }
    if let Some(plan) = tls {
        needs.add_tls(&plan.options);
    }
    for upstream in loaded.upstreams() {
        needs.connect_to(&upstream);
    }
    // The caches' folders: bodies are written, sent and removed there.
    for site in &loaded.sites {
        for disk in site
            .routes
            .iter()
            .filter_map(|r| r.cache.as_ref()?.disk.as_ref())
        {
            if !needs.write.contains(&disk.folder) {
                needs.write.push(disk.folder.clone());
                needs.give.push(tern_sandbox::Give::Folder {
                    path: disk.folder.clone(),
                    made_by_tern: vec![tern_cache::disk::FILE_PREFIX.to_owned()],
                });
            }
        }
    }
    for file in loaded.upstream_tls_files() {
        needs.read_file(&file);
    }
    needs
}

/// A proxy or PHP route's cache: its named store, shared across routes and reloads.
fn route_cache(
    c: &config::CachePlan,
    site: &str,
    route: &str,
    workers: usize,
) -> Result<tern_proxy::cache::RouteCache, String> {
    let shape = tern_proxy::cache::StoreShape {
        memory: c.memory,
        max_object: c.max_object,
        disk: c
            .disk
            .as_ref()
            .map(|d| (d.folder.clone(), d.size, d.max_object)),
    };
    let (store, counts) = tern_proxy::cache::shared_store(&c.name, &shape, workers)?;
    Ok(tern_proxy::cache::RouteCache::new(
        store,
        counts,
        c.rules.clone(),
        // The site and the route are part of every key.
        format!("{site} {route}"),
        c.status_field,
        c.lock,
    ))
}

/// `SERVER_NAME` for a site's scripts: its first host that names one host (nginx passes its
/// first `server_name`), never the client's `Host`. A site with none (a catch-all, or only
/// `*.` patterns) has no name of its own: empty, as nginx passes for a server with no
/// `server_name`, since any `Host` reaches it and so proves nothing.
fn server_name(hosts: &[String]) -> String {
    hosts
        .iter()
        .find(|h| !h.starts_with("*."))
        .cloned()
        .unwrap_or_default()
}

/// Opens every static root and assembles the table. `app` is the running game, if any;
/// `gate` the gateway that routes with `gate = true` stand behind.
/// The access-log files, in the order the server gets them, and the log of each site.
struct LogPlan {
    files: Vec<(PathBuf, LogFormatArg)>,
    targets: Vec<LogTarget>,
}

/// The server-wide log (`--access-log`, or `access_log` at the top) first, then each file a
/// site names, once.
fn log_plan(loaded: &RunConfig, common: &CommonArgs) -> Result<LogPlan, String> {
    let mut files: Vec<(PathBuf, LogFormatArg)> = Vec::new();
    if let Some(path) = &common.access_log {
        files.push((path.clone(), common.access_log_format.unwrap_or_default()));
    }
    let shared = if files.is_empty() {
        LogTarget::OFF
    } else {
        LogTarget::DEFAULT
    };
    let mut targets = Vec::with_capacity(loaded.sites.len());
    for site in &loaded.sites {
        targets.push(match &site.log {
            SiteLog::Shared => shared,
            SiteLog::Off => LogTarget::OFF,
            SiteLog::Own(path, format) => match files.iter().position(|(p, _)| p == path) {
                Some(i) if files[i].1 != *format => {
                    return Err(format!(
                        "site {:?}: the access log {} is written in another format by another site",
                        site.name,
                        path.display()
                    ))
                }
                Some(i) => LogTarget::log(i),
                None => {
                    files.push((path.clone(), *format));
                    LogTarget::log(files.len() - 1)
                }
            },
        });
    }
    Ok(LogPlan { files, targets })
}

fn build_table(
    loaded: &RunConfig,
    app: Option<&Arc<dyn Handler>>,
    gate: Option<&tern_gate::Gate>,
    workers: usize,
    logs: &[LogTarget],
    stats: &tern_server::Stats,
) -> Result<SiteTable, String> {
    let mut sites = Vec::with_capacity(loaded.sites.len());
    for (index, site) in loaded.sites.iter().enumerate() {
        let site_row = stats.site(&site.name);
        let mut routes = Vec::with_capacity(site.routes.len() + 1);
        if let (Some(gate), true) = (gate, site.routes.iter().any(|r| r.guarded)) {
            // The gate's own pages (login, challenge, its scripts) on every guarded site.
            let prefix = gate.config().config.path_prefix.clone();
            routes.push(Route {
                options: RouteOptions {
                    counted_as: Some(stats.route(site_row, &prefix)),
                    ..RouteOptions::default()
                },
                prefix,
                action: Action::Handler(Arc::new(gate.endpoints())),
                headers: Default::default(),
            });
        }
        // Upstream groups named so far in this site (see `group_name`).
        let mut groups_named: HashMap<String, usize> = HashMap::new();
        for route in &site.routes {
            let group_name = group_name(&site.name, route, &mut groups_named);
            let proxied = matches!(route.kind, RouteKind::Proxy(_) | RouteKind::FastCgi { .. });
            let action = match &route.kind {
                RouteKind::Static(options) => {
                    let files = StaticFiles::new(options.clone()).map_err(|e| {
                        format!(
                            "site {:?}: cannot serve {}: {e}",
                            site.name,
                            options.root.display()
                        )
                    })?;
                    Action::Handler(Arc::new(files))
                }
                RouteKind::Redirect {
                    status,
                    target,
                    keep_path,
                } => Action::Redirect(Redirect {
                    status: *status,
                    target: target.clone(),
                    keep_path: *keep_path,
                }),
                RouteKind::Respond {
                    status,
                    body,
                    content_type,
                } => Action::Fixed(Fixed {
                    status: *status,
                    body: bytes::Bytes::from(body.clone().into_bytes()),
                    content_type: content_type.clone(),
                }),
                RouteKind::Rewrite(target) => Action::Rewrite(target.clone()),
                RouteKind::App => Action::Handler(app.cloned().ok_or(
                    "an app route was added, but the game starts only with tern: restart tern to add it",
                )?),
                RouteKind::Counters {
                    prometheus,
                    trusted,
                } => Action::Handler(Arc::new(
                    tern_services::metrics::CountersPage::new(
                        stats.clone(),
                        *prometheus,
                        trusted.clone(),
                    )
                    .with_more(tern_proxy::health::metrics),
                )),
                RouteKind::FastCgi {
                    files,
                    upstream,
                    index,
                    params,
                } => {
                    let static_files = StaticFiles::new(files.clone()).map_err(|e| {
                        format!(
                            "site {:?}: cannot serve {}: {e}",
                            site.name,
                            files.root.display()
                        )
                    })?;
                    let group = tern_proxy::UpstreamGroup::new(
                        tern_proxy::GroupOptions {
                            counted_as: stats.upstream(&group_name),
                            name: group_name,
                            ..upstream.group.clone()
                        },
                        workers,
                    );
                    let options = tern_proxy::ProxyOptions {
                        gate_cookie: gate.map(|g| g.config().config.cookie.clone()),
                        ..upstream.options.clone()
                    };
                    let mut fastcgi = tern_proxy::fastcgi::FastCgi::new(
                        Arc::new(group),
                        tern_proxy::fastcgi::FastCgiOptions {
                            index: index.clone(),
                            server_name: server_name(&site.hosts),
                            params: params.clone(),
                        },
                        options,
                        static_files,
                    );
                    if let Some(c) = &route.cache {
                        fastcgi = fastcgi.with_cache(route_cache(c, &site.name, &route.label, workers)?);
                    }
                    Action::Handler(Arc::new(fastcgi))
                }
                RouteKind::Proxy(plan) => {
                    let group = Arc::new(tern_proxy::UpstreamGroup::new(
                        tern_proxy::GroupOptions {
                            counted_as: stats.upstream(&group_name),
                            name: group_name,
                            ..plan.group.clone()
                        },
                        workers,
                    ));
                    tern_proxy::health::watch(&group);
                    let options = tern_proxy::ProxyOptions {
                        // Browsers send the gate's cookies to every route of the host.
                        gate_cookie: gate.map(|g| g.config().config.cookie.clone()),
                        ..plan.options.clone()
                    };
                    let mut proxy = tern_proxy::Proxy::new(group, options);
                    if let Some(c) = &route.cache {
                        proxy = proxy.with_cache(route_cache(c, &site.name, &route.label, workers)?);
                    }
                    let proxy: Arc<dyn Handler> = Arc::new(proxy);
                    // Inside the guard: the gate judges the path the client asked for, the
                    // app gets it without the prefix.
                    Action::Handler(if route.options.strip_prefix {
                        Arc::new(tern_vhost::StripPrefix::new(&route.prefix, proxy)?)
                    } else {
                        proxy
                    })
                }
            };
            let action = match (action, gate) {
                (Action::Handler(h), Some(gate)) if route.guarded => Action::Handler(Arc::new(
                    tern_server::Guarded::new(Arc::new(gate.clone()), h),
                )),
                (action, _) => action,
            };
            let o = &route.options;
            routes.push(Route {
                prefix: route.prefix.clone(),
                action,
                headers: route.headers.clone(),
                options: RouteOptions {
                    matchers: o.matchers.clone(),
                    try_files: o.try_files.clone(),
                    max_body: o.max_body,
                    // New buckets on a reload: a limit starts over with the new table.
                    rate_limit: o
                        .rate_limit
                        .clone()
                        .map(|c| Arc::new(tern_services::PrefixLimiter::new(c, workers))),
                    compress: o.compress.clone(),
                    counted_as: Some(stats.route(site_row, &route.label)),
                    allow_encoded_slash: o.allow_encoded_slash,
                    // nginx's rule for a proxy or FastCGI location written with its slash.
                    redirect_bare_prefix: proxied,
                    internal: o.internal,
                    x_accel_redirect: o.x_accel_redirect,
                    reroute_status: o.reroute_status.clone(),
                },
            });
        }
        sites.push(Site {
            name: site.name.clone(),
            hosts: site.hosts.clone(),
            routes,
            log: logs[index],
            counted_as: site_row,
            error_pages: site.error_pages.clone(),
            request_ids: site.request_ids.clone(),
            compress: site.compress.clone(),
            headers: site.headers.clone(),
        });
    }
    SiteTable::new(sites, loaded.default_site)
}

fn describe_table(table: &SiteTable) -> String {
    let (sites, routes) = (table.site_count(), table.route_count());
    format!(
        "{sites} site{} ({routes} route{})",
        if sites == 1 { "" } else { "s" },
        if routes == 1 { "" } else { "s" }
    )
}

/// What was fixed at start-up; a reload that asks to change it is told to restart.
struct Started {
    listen: Vec<std::net::SocketAddr>,
    kinds: Vec<tern_server::ListenerKind>,
    workers: usize,
    pin: bool,
    /// The sockets' backend (`io`, `--io`).
    io: tern_runtime::IoChoice,
    shutdown_grace: std::time::Duration,
    tls: bool,
    /// WebSocket over HTTP/2 offered in the SETTINGS (`RunConfig::http2_websocket`): a
    /// reload that adds the first proxy route offers it only after a restart; HTTP/1.1
    /// upgrades work at once.
    http2_websocket: bool,
    app: Option<AppPlan>,
    hardening: FileHardening,
    /// The control socket and its group (made once, before privileges are dropped).
    control: Option<PathBuf>,
    control_group: Option<String>,
}

impl Started {
    fn new(loaded: &RunConfig, config: &ServerConfig, tls: bool) -> Started {
        Started {
            listen: config.runtime.listen.clone(),
            kinds: config.listener_kinds.clone(),
            workers: config.runtime.workers,
            pin: config.runtime.pin,
            io: config.runtime.io,
            shutdown_grace: config.runtime.shutdown_grace,
            tls,
            http2_websocket: loaded.http2_websocket(),
            app: loaded.app.clone(),
            hardening: loaded.hardening(),
            control: loaded.control(),
            control_group: loaded.control_group.as_ref().map(|g| g.name.clone()),
        }
    }

    /// The settings of `new` that differ from these, by name.
    fn differences(&self, new: &Started) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.listen != new.listen || self.kinds != new.kinds {
            out.push("listeners");
        }
        if self.workers != new.workers {
            out.push("workers");
        }
        if self.pin != new.pin {
            out.push("pin");
        }
        if self.io != new.io {
            out.push("io");
        }
        if self.shutdown_grace != new.shutdown_grace {
            out.push("shutdown_grace");
        }
        if self.tls != new.tls {
            out.push("HTTPS on/off");
        }
        if self.http2_websocket != new.http2_websocket {
            out.push("http2_websocket");
        }
        if self.app.is_some() && new.app.is_some() && self.app != new.app {
            out.push("the app's data or pages");
        }
        let (a, b) = (&self.hardening, &new.hardening);
        if a.user != b.user || a.group != b.group || a.sandbox != b.sandbox {
            out.push("user, group or sandbox");
        }
        if self.control != new.control || self.control_group != new.control_group {
            out.push("control or control_group");
        }
        out
    }
}

/// The state the reload (`SIGHUP`, the control socket's `reload`) keeps between reloads.
struct Reloader {
    path: PathBuf,
    flags: CommonArgs,
    started: Started,
    app: Option<Arc<dyn Handler>>,
    sites: Sites,
    acceptor: Option<Arc<TlsAcceptor>>,
    /// The gateway opened at start-up (a new `gate` file needs a restart).
    gate: Option<tern_gate::Gate>,
    workers: usize,
    /// The access-log files opened at start-up (others need a restart).
    log_files: Vec<(PathBuf, LogFormatArg)>,
    stats: tern_server::Stats,
    /// Where the sandbox lets the workers connect (fixed at start-up; `None`: no sandbox).
    sandbox_connect: Option<tern_sandbox::Connect>,
}

impl Reloader {
    /// Re-reads the file and, if all of it is usable, swaps the table and applies the
    /// timeouts and limits. Returns the log line's text, or the reason nothing changed.
    fn reload(&mut self, server: ServerReload<'_>, trigger: ReloadTrigger) -> ReloadOutcome {
        let loaded = config::load(&self.path).map_err(|problems| {
            let more = problems.len() - 1;
            let mut first = problems.into_iter().next().unwrap_or_default();
            if more > 0 {
                first.push_str(&format!(
                    " (and {more} more problem{}: see tern run --check)",
                    if more == 1 { "" } else { "s" }
                ));
            }
            first
        })?;
        let tls = loaded.tls_plan()?;
        let common = loaded.common(&self.flags);
        let config = listeners(&common, tls.as_ref());
        let restart = self
            .started
            .differences(&Started::new(&loaded, &config, tls.is_some()));
        if let Some(connect) = &self.sandbox_connect {
            // A route to an upstream the workers cannot reach would fail every request: the
            // whole reload is refused instead, and the old routes go on.
            if let Some(upstream) = loaded
                .upstreams()
                .into_iter()
                .find(|u| !hardening::can_connect(connect, u))
            {
                return Err(format!(
                    "the upstream {upstream} is outside what the sandbox allows (the ports and socket folders of the upstreams at start-up): restart tern to use it"
                ));
            }
        }
        if loaded.gate().is_some() && self.gate.is_none() {
            return Err("a gate was added: restart tern to start it".into());
        }
        if let Some(gate) = &self.gate {
            crate::gate::reload(gate, trigger);
        }
        // Everything that can fail comes before anything is applied.
        let logs = log_plan(&loaded, &common)?;
        if logs.files != self.log_files {
            return Err("the access-log files changed: restart tern to open them".into());
        }
        let table = build_table(
            &loaded,
            self.app.as_ref(),
            self.gate.as_ref(),
            self.workers,
            &logs.targets,
            &self.stats,
        )?;
        tern_proxy::health::start()
            .map_err(|e| format!("cannot start the health checker thread: {e}"))?;
        let tls_note = match (&self.acceptor, &tls) {
            (Some(acceptor), Some(plan)) => {
                acceptor.reload(&plan.options)?;
                "; certificates re-read"
            }
            _ => "",
        };
        let before = describe_table(&self.sites.current());
        let after = describe_table(&table);
        self.sites.swap(table);
        server(&config);
        let mut line = if before == after {
            after
        } else {
            format!("{after} (was {before})")
        };
        line.push_str(tls_note);
        line.push_str("; cached files dropped");
        if !restart.is_empty() {
            line.push_str(&format!(
                "; {} need(s) a restart (ignored)",
                restart.join(", ")
            ));
        }
        Ok(line)
    }
}

/// What the health figures and the upstream counters call a route's upstream group: "SITE
/// ROUTE" (the route's `name`, or its path as written). Routes of one path told apart by
/// matchers share their `route` label on purpose, but each has servers of its own: the
/// second group of a name is "SITE ROUTE#2", and so on, so that no two groups share a row.
/// Routes without upstreams take no number.
fn group_name(site: &str, route: &config::RoutePlan, named: &mut HashMap<String, usize>) -> String {
    let base = format!("{site} {}", route.label);
    if !matches!(route.kind, RouteKind::Proxy(_) | RouteKind::FastCgi { .. }) {
        return base;
    }
    let n = named.entry(base.clone()).or_insert(0);
    *n += 1;
    if *n == 1 {
        base
    } else {
        format!("{base}#{n}")
    }
}

#[cfg(test)]
mod tests {
    use super::server_name;

    #[test]
    fn a_sites_server_name_is_its_first_exact_host_or_none() {
        let hosts = |list: &[&str]| list.iter().map(|h| h.to_string()).collect::<Vec<_>>();
        assert_eq!(
            server_name(&hosts(&["a.example", "b.example"])),
            "a.example"
        );
        assert_eq!(
            server_name(&hosts(&["*.a.example", "a.example"])),
            "a.example"
        );
        assert_eq!(server_name(&hosts(&["[::1]"])), "[::1]");
        // A catch-all, or only wildcards: no name of its own.
        assert_eq!(server_name(&[]), "");
        assert_eq!(server_name(&hosts(&["*.a.example"])), "");
    }
}
