//! Automatic HTTPS for `tern serve` (`--acme NAME` flags) and `tern run` (`[tls.acme]`): the
//! settings, the helper process (`tern acme-helper`, started before the sandbox, as the gate's
//! exec helpers are), and its counters for `/statusz` and `/metrics`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use serde::Deserialize;
use tern_acme::receiver::ReceiveLoop;
use tern_acme::{AcmeConfig, ChallengeKind, Receiver, LETS_ENCRYPT};
use tern_server::TlsAcceptor;
use tern_services::metrics::Metric;

#[derive(Args, Debug, Clone, Default)]
pub struct AcmeArgs {
    /// Get and renew a certificate for NAME from an ACME CA (Let's Encrypt unless
    /// --acme-directory), with no manual step; repeat for more names. An IP address gets a
    /// short-lived certificate. Giving it accepts the CA's terms of service. Needs
    /// --acme-state.
    #[arg(long = "acme", value_name = "NAME", help_heading = "Automatic HTTPS")]
    pub names: Vec<String>,
    /// Contact address for the ACME account (the CA's expiry and policy mails).
    #[arg(long, value_name = "EMAIL", help_heading = "Automatic HTTPS")]
    pub acme_email: Option<String>,
    /// A persistent, writable folder for the ACME account, certificates and keys. Keep it
    /// across restarts: a restart with it orders nothing.
    #[arg(long, value_name = "DIR", help_heading = "Automatic HTTPS")]
    pub acme_state: Option<PathBuf>,
    /// The CA's ACME directory URL [default: Let's Encrypt's production directory].
    #[arg(long, value_name = "URL", help_heading = "Automatic HTTPS")]
    pub acme_directory: Option<String>,
    /// A root certificate (PEM) to trust for the directory's own HTTPS (a private CA, Pebble).
    #[arg(long, value_name = "FILE", help_heading = "Automatic HTTPS")]
    pub acme_ca_root: Option<PathBuf>,
    /// Challenge types, tried in order [default: tls-alpn-01, then http-01 when there is a
    /// plain listener (--listen or --redirect-http)].
    #[arg(long = "acme-challenge", value_name = "tls-alpn-01|http-01", value_parser = ["tls-alpn-01", "http-01"], help_heading = "Automatic HTTPS")]
    pub challenges: Vec<String>,
    /// The CA profile to ask for (Let's Encrypt: classic, tlsserver, shortlived).
    #[arg(long, value_name = "NAME", help_heading = "Automatic HTTPS")]
    pub acme_profile: Option<String>,
}

/// `[tls.acme]` of a config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAcme {
    email: Option<String>,
    directory: Option<String>,
    #[serde(default)]
    agree_tos: bool,
    state: Option<PathBuf>,
    profile: Option<String>,
    /// Names to get certificates for [default: the sites' hosts].
    names: Option<Vec<String>>,
    challenges: Option<Vec<String>>,
    ca_root: Option<PathBuf>,
    /// External account binding, for CAs that need it (ZeroSSL, Google Trust Services).
    eab_kid: Option<String>,
    eab_hmac: Option<String>,
}

/// The ACME settings from flags (win) and `[tls.acme]`; `None` when ACME is off. `hosts` are
/// the names a config file's sites answer (for `tern run`); `plain_listener` says whether
/// HTTP-01 can be answered.
pub fn resolve(
    args: &AcmeArgs,
    file: Option<&FileAcme>,
    file_dir: &Path,
    hosts: &[String],
    plain_listener: bool,
) -> Result<Option<AcmeConfig>, String> {
    if args.names.is_empty() && file.is_none() {
        if args.acme_state.is_some() || args.acme_email.is_some() || args.acme_directory.is_some() {
            return Err("--acme-state, --acme-email and --acme-directory need --acme NAME".into());
        }
        return Ok(None);
    }
    let empty = FileAcme::default();
    let f = file.unwrap_or(&empty);
    if file.is_some() && !f.agree_tos {
        return Err("[tls.acme] needs `agree_tos = true` (the CA's terms of service)".into());
    }
    let names: Vec<String> = if !args.names.is_empty() {
        args.names.clone()
    } else if let Some(names) = &f.names {
        names.clone()
    } else {
        hosts.to_vec()
    };
    let names: Vec<String> = names.iter().map(|n| n.to_ascii_lowercase()).collect();
    if names.is_empty() {
        return Err(
            "ACME has no name to get a certificate for (give the sites hosts, or [tls.acme] names)"
                .into(),
        );
    }
    let state = args
        .acme_state
        .clone()
        .or_else(|| f.state.as_ref().map(|p| file_dir.join(p)))
        .ok_or("ACME needs a persistent state folder: give --acme-state DIR (or `state` in [tls.acme])")?;
    // The helper runs in `/`: relative paths are taken from here, now.
    let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    let state = absolute(state);
    let challenge_names: Vec<String> = if !args.challenges.is_empty() {
        args.challenges.clone()
    } else if let Some(c) = &f.challenges {
        c.clone()
    } else if plain_listener {
        vec!["tls-alpn-01".into(), "http-01".into()]
    } else {
        vec!["tls-alpn-01".into()]
    };
    let challenges = challenge_names
        .iter()
        .map(|c| ChallengeKind::parse(c))
        .collect::<Result<Vec<_>, _>>()?;
    if challenges.contains(&ChallengeKind::Http01) && !plain_listener {
        return Err("the http-01 challenge needs a plain HTTP listener (--listen or --redirect-http, on port 80 for a public CA)".into());
    }
    let eab = match (&f.eab_kid, &f.eab_hmac) {
        (Some(kid), Some(hmac)) => Some((kid.clone(), hmac.clone())),
        (None, None) => None,
        _ => return Err("[tls.acme] eab_kid and eab_hmac come together".into()),
    };
    let config = AcmeConfig {
        directory: args
            .acme_directory
            .clone()
            .or_else(|| f.directory.clone())
            .unwrap_or_else(|| LETS_ENCRYPT.to_string()),
        email: args.acme_email.clone().or_else(|| f.email.clone()),
        state,
        names,
        profile: args.acme_profile.clone().or_else(|| f.profile.clone()),
        eab,
        challenges,
        ca_root: args
            .acme_ca_root
            .clone()
            .or_else(|| f.ca_root.as_ref().map(|p| file_dir.join(p)))
            .map(absolute),
    };
    config.validate()?;
    Ok(Some(config))
}

/// The state folder must exist (or be creatable) and be writable now: finding out at the
/// first issuance would mean ordering again on every restart.
fn check_state_folder(state: &Path) -> Result<(), String> {
    std::fs::create_dir_all(state)
        .map_err(|e| format!("ACME state folder {}: {e}", state.display()))?;
    let probe = state.join(format!(".tern-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| format!("ACME state folder {} is not writable: {e}", state.display()))
}

/// Starts `tern acme-helper` before the sandbox, and returns the handle on it and the loop
/// that receives its certificates (for a background thread of the server: threads may only
/// start once the sandbox is on). The helper runs as the account tern drops to (`user`, `group`), with an empty
/// environment but for what TLS and logging need.
pub fn start(
    config: &AcmeConfig,
    acceptor: Arc<TlsAcceptor>,
    hardening: &crate::hardening::HardeningArgs,
    file: Option<&crate::hardening::FileHardening>,
) -> Result<(Receiver, ReceiveLoop), String> {
    use crate::hardening::{helper_command, own_binary, SandboxArg};
    use std::process::Stdio;
    let settings = hardening.in_force(file);
    check_state_folder(&config.state)?;
    let account = settings
        .user
        .as_deref()
        .map(|u| tern_sandbox::Account::lookup(u, settings.group.as_deref()))
        .transpose()?;
    let mut cmd = helper_command(&own_binary()?, "acme-helper", account.as_ref());
    if settings.sandbox == Some(SandboxArg::Off) {
        cmd.arg("--no-sandbox");
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for keep in ["TERN_LOG", "SSL_CERT_FILE", "SSL_CERT_DIR"] {
        if let Some(v) = std::env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the ACME helper: {e}"))?;
    let to = child.stdin.take().expect("piped stdin");
    let from = child.stdout.take().expect("piped stdout");
    let line = serde_json::to_string(config).map_err(|e| e.to_string())? + "\n";
    let (receiver, receive) = Receiver::new(from.into(), to, &line, acceptor)?;
    // The child is reaped by nobody: it lives as long as tern (its stdin closes with tern).
    std::mem::forget(child);
    let status = receiver.status.clone();
    tern_services::metrics::add_metrics_source(move || metrics(&status));
    tracing::info!(
        "automatic HTTPS for {} from {} (state in {})",
        config.names.join(", "),
        config.directory,
        config.state.display()
    );
    Ok((receiver, receive))
}

/// Runs the receiving loop on a background thread of `server`.
pub fn install(server: &mut tern_server::Server, receive: ReceiveLoop) {
    server.background("acme-receiver", move |stop| {
        receive.run(|| stop.is_stopped())
    });
}

/// `tern acme-helper`: reads its settings from stdin, locks itself down (below), then runs
/// until the server closes its stdin.
pub fn helper_main(sandbox: bool) -> Result<(), String> {
    let mut input = std::io::BufReader::new(std::io::stdin());
    let config = tern_acme::helper::read_config(&mut input)?;
    if sandbox {
        lock_down_helper(&config);
    }
    tern_acme::helper::run(config, input, std::io::stdout().lock())
}

/// The helper's own Landlock sandbox, narrower than the server's in what it reads and wider
/// in where it connects: it reads only what name resolution and TLS need (and the CA root
/// given), writes only the state folder, executes nothing, binds nothing, and connects over
/// TCP only to the directory's port, 443 and DNS's 53. DNS over UDP is not covered by
/// Landlock. Best effort: a kernel without Landlock leaves the helper as it is, with a log
/// line.
fn lock_down_helper(config: &AcmeConfig) {
    let mut read: Vec<PathBuf> = [
        "/etc/resolv.conf",
        "/etc/hosts",
        "/etc/nsswitch.conf",
        "/etc/host.conf",
        "/etc/gai.conf",
        "/etc/ssl",
        "/etc/pki",
        "/etc/ca-certificates",
        "/usr/share/ca-certificates",
        "/usr/lib",
        "/lib",
        "/lib64",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| p.exists())
    .collect();
    // The CA root, or its folder while it is missing (it may be put there later).
    read.extend(config.ca_root.iter().map(|root| match root.exists() {
        true => root.clone(),
        false => root.parent().map(Path::to_path_buf).unwrap_or_default(),
    }));
    let port = directory_port(&config.directory);
    let paths = tern_sandbox::Paths {
        read,
        write: vec![config.state.clone()],
        connect: tern_sandbox::Connect {
            tcp_ports: vec![port, 443, 53],
            unix_folders: Vec::new(),
        },
        ..Default::default()
    };
    match tern_sandbox::landlock::restrict(&paths, false) {
        Ok(r) => tracing::debug!("acme helper: Landlock {}", r.status),
        Err(e) => tracing::warn!("acme helper: runs without Landlock: {e}"),
    }
}

/// The TCP port of an `https://host[:port]/...` URL.
fn directory_port(url: &str) -> u16 {
    let rest = url.strip_prefix("https://").unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or("");
    // `[v6]:port` or `host:port`.
    let port = match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') && !port.contains(']') => port.parse().ok(),
        _ => None,
    };
    port.unwrap_or(443)
}

/// The helper's status as counters: orders by result, seconds to each certificate's expiry
/// and to its next renewal.
fn metrics(status: &tern_acme::AcmeStatus) -> Vec<Metric> {
    let s = status.snapshot();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let mut out = vec![
        Metric::counter("acme_orders", "ACME orders, by result", s.orders_valid)
            .with_label("result", "valid"),
        Metric::counter("acme_orders", "ACME orders, by result", s.orders_failed)
            .with_label("result", "failed"),
        Metric::counter(
            "acme_checks",
            "Looks the ACME helper took at every certificate (renewal due? ARI?)",
            s.checks,
        ),
        Metric::counter(
            "acme_certificates_installed",
            "Certificates the ACME helper handed to the server (stored ones at start included)",
            status.installed(),
        ),
        Metric::gauge(
            "acme_helper_up",
            "1 while the ACME helper runs",
            if status.helper_running() { 1.0 } else { 0.0 },
        ),
    ];
    for c in &s.certs {
        if c.not_after > 0 {
            out.push(
                Metric::gauge(
                    "acme_certificate_expiry_seconds",
                    "Seconds until the certificate in use expires",
                    (c.not_after - now) as f64,
                )
                .with_label("name", c.name.clone()),
            );
        }
        out.push(
            Metric::gauge(
                "acme_next_renewal_seconds",
                "Seconds until the next order (renewal, or retry after a failure)",
                (c.next_renewal - now).max(0) as f64,
            )
            .with_label("name", c.name.clone()),
        );
    }
    out
}

/// `/statusz` and `/metrics` for `tern serve`, which has no counters page of its own: the
/// process's counters (the ACME ones included), for this machine only.
pub fn counters_routes(router: tern_server::Router) -> tern_server::Router {
    use tern_server::{HandlerContext, Method, Request};
    let started = std::time::Instant::now();
    let page = move |prometheus: bool| {
        move |req: &Request<'_>, _: &mut HandlerContext<'_>| {
            let trusted = tern_services::TrustedProxies::default();
            if !tern_services::metrics::may_read_counters(req, &trusted) {
                return tern_services::metrics::counters_refused().into();
            }
            tern_services::metrics::page(
                &tern_services::metrics::process_metrics(started),
                prometheus,
            )
            .into()
        }
    };
    router
        .route(Method::Get, "/statusz", page(false))
        .route(Method::Get, "/metrics", page(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn the_directory_port_comes_from_its_url() {
        assert_eq!(directory_port(LETS_ENCRYPT), 443);
        assert_eq!(directory_port("https://127.0.0.1:14000/dir"), 14000);
        assert_eq!(directory_port("https://[::1]:14000/dir"), 14000);
        assert_eq!(directory_port("https://[::1]/dir"), 443);
    }

    #[test]
    fn flags_need_a_state_folder_and_refuse_wildcards() {
        let dir = state();
        let mut args = AcmeArgs {
            names: vec!["a.test".into()],
            ..AcmeArgs::default()
        };
        let e = resolve(&args, None, Path::new(""), &[], false).unwrap_err();
        assert!(e.contains("state folder"), "{e}");
        args.acme_state = Some(dir.path().join("acme"));
        let c = resolve(&args, None, Path::new(""), &[], false)
            .unwrap()
            .unwrap();
        assert_eq!(c.directory, LETS_ENCRYPT);
        assert_eq!(c.challenges, vec![ChallengeKind::TlsAlpn01]);
        let c = resolve(&args, None, Path::new(""), &[], true)
            .unwrap()
            .unwrap();
        assert_eq!(
            c.challenges,
            vec![ChallengeKind::TlsAlpn01, ChallengeKind::Http01]
        );
        args.challenges = vec!["http-01".into()];
        let e = resolve(&args, None, Path::new(""), &[], false).unwrap_err();
        assert!(e.contains("plain HTTP listener"), "{e}");
        args.names = vec!["*.a.test".into()];
        let e = resolve(&args, None, Path::new(""), &[], true).unwrap_err();
        assert!(e.contains("DNS-01"), "{e}");
        let none = AcmeArgs::default();
        assert_eq!(
            resolve(&none, None, Path::new(""), &[], true).unwrap(),
            None
        );
    }

    #[test]
    fn the_file_section_takes_the_sites_hosts_and_needs_the_terms_agreed() {
        let dir = state();
        let file: FileAcme = toml::from_str("email = \"a@b.test\"\nstate = \"acme\"\n").unwrap();
        let hosts = vec!["a.test".to_string(), "www.a.test".to_string()];
        let e = resolve(&AcmeArgs::default(), Some(&file), dir.path(), &hosts, true).unwrap_err();
        assert!(e.contains("agree_tos"), "{e}");
        let file: FileAcme = toml::from_str(
            "email = \"a@b.test\"\nstate = \"acme\"\nagree_tos = true\nprofile = \"shortlived\"\n",
        )
        .unwrap();
        let c = resolve(&AcmeArgs::default(), Some(&file), dir.path(), &hosts, true)
            .unwrap()
            .unwrap();
        assert_eq!(c.names, hosts);
        assert_eq!(c.state, dir.path().join("acme"));
        assert_eq!(c.profile.as_deref(), Some("shortlived"));
        assert!(toml::from_str::<FileAcme>("bogus = 1").is_err());
        let file: FileAcme =
            toml::from_str("state = \"acme\"\nagree_tos = true\neab_kid = \"k\"\n").unwrap();
        let e = resolve(&AcmeArgs::default(), Some(&file), dir.path(), &hosts, true).unwrap_err();
        assert!(e.contains("eab_kid and eab_hmac"), "{e}");
    }
}
