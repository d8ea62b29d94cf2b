//! A `proxy` route: its upstream servers (`host:port`, `unix:/path`, `https://host:port`)
//! and how requests reach them: balance, failures, timeouts, retries, health checks, TLS to
//! the upstreams, and the request's own edits. A PHP route's FastCGI servers are checked
//! here too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use toml::Spanned;

use super::file::{HealthCheckFile, RouteFile, Servers};
use super::headers::check_edits;
use super::plan::{ProxyPlan, RouteKind};
use super::problems::Problems;
use super::route::{kind_keys, KindKey};

/// The keys of a proxy route besides `proxy` (with [`UPSTREAM_KEYS`]).
pub(super) const KEYS: &[KindKey] = kind_keys![
    strip_prefix,
    allow_encoded_slash,
    add_request_headers,
    remove_request_headers,
    proxy_host,
    proxy_tls_server_name,
    proxy_tls_ca,
    proxy_tls_client_cert,
    proxy_tls_client_key,
    // Checks speak HTTP: a FastCGI server would fail them all.
    health_check,
];

/// The keys of the upstream servers, a proxy's and a PHP route's FastCGI servers alike.
pub(super) const UPSTREAM_KEYS: &[KindKey] = kind_keys![
    balance,
    max_fails,
    fail_timeout,
    connect_timeout,
    first_byte_timeout,
    upstream_idle_timeout,
    keepalive,
    retries,
    retry_budget,
    retry_on_status,
    trusted_proxies,
];

/// What a proxy or PHP route does with its app's answers: a hand-back to the site.
pub(super) const ANSWER_KEYS: &[KindKey] = kind_keys![x_accel_redirect, reroute_status];

/// Where Debian keeps the system's CA certificates (what `rustls-native-certs` reads there).
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The route's servers (`proxy`, or a PHP route's `fastcgi`) and the keys of how requests
/// reach them.
pub(super) fn check_proxy(
    route: &RouteFile,
    dir: &Path,
    p: &mut Problems<'_>,
) -> Option<RouteKind> {
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

#[cfg(test)]
mod tests {
    use super::super::plan::{ProxyPlan, RouteKind, RunConfig};
    use super::super::{
        parse,
        testing::{dir, problems},
    };

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
