//! The HTTPS flags and `[tls]` config section shared by `tern serve` and `tern demo`, and how
//! they become listeners and a [`TlsAcceptor`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::collections::BTreeMap;

use clap::Args;
use serde::Deserialize;
use tern_server::{CertFiles, ListenerKind, RedirectHttp, ServerConfig, TlsAcceptor, TlsOptions};
use toml::Spanned;

/// The HTTPS listener's address when TLS is on and none is given.
const DEFAULT_LISTEN_TLS: &str = "127.0.0.1:8443";

#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Address and port for HTTPS [default: 127.0.0.1:8443 once a certificate is given]. With
    /// TLS on, plain HTTP is served only if --listen is given too.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen_tls: Option<SocketAddr>,
    /// Certificate chain, PEM, leaf first. Repeat --tls-cert/--tls-key pairs for several
    /// certificates, chosen by SNI from their DNS names (exact or *.wildcard); the first one
    /// is the default for clients that send no or an unknown name.
    #[arg(long = "tls-cert", value_name = "FULLCHAIN.pem")]
    pub certs: Vec<PathBuf>,
    /// Private key of the matching --tls-cert, PEM (PKCS#8, SEC1 or PKCS#1; ECDSA or RSA).
    #[arg(long = "tls-key", value_name = "KEY.pem")]
    pub keys: Vec<PathBuf>,
    /// Make a certificate for localhost, 127.0.0.1 and ::1 at start-up (for development; its
    /// SHA-256 fingerprint is printed).
    #[arg(long)]
    pub tls_self_signed: bool,
    /// File of session-ticket keys (created 0600 if missing), so that sessions resume across
    /// restarts [default: in memory; tern demo: DATA/tls-ticket-keys].
    #[arg(long, value_name = "FILE")]
    pub tls_ticket_keys: Option<PathBuf>,
    /// A plain HTTP listener that answers every request with 308 to the same URL on https.
    #[arg(long, value_name = "ADDR:PORT")]
    pub redirect_http: Option<SocketAddr>,
    /// Add `Strict-Transport-Security: max-age=SECS` to HTTPS answers.
    #[arg(long, value_name = "SECS")]
    pub hsts: Option<u64>,
    /// Do not serve HTTP/3. By default HTTPS is served over QUIC too, on the UDP port of the
    /// HTTPS listener, and advertised to HTTPS clients with `Alt-Svc` (a firewall must let
    /// that UDP port in for clients to use it; they fall back to TCP if it does not).
    #[arg(long)]
    pub no_http3: bool,
    /// Accept HTTP/3 requests in 0-RTT early data from clients resuming a session (one round
    /// trip less). Early data can be replayed by an attacker who saw it: sessions are then
    /// single-use and kept in memory (not across restarts), and only GET, HEAD and OPTIONS
    /// that tern answers itself (files, fixed answers, cache hits) are answered from early
    /// data; the rest get `425 Too Early` and the client sends them after the handshake.
    #[arg(long)]
    pub http3_0rtt: bool,
    /// Automatic HTTPS was asked for on the command line (`tern serve --acme`).
    #[arg(skip)]
    pub acme: bool,
}

/// The `[tls]` section of a config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileTls {
    listen: Option<SocketAddr>,
    #[serde(default)]
    certificates: Vec<FileCert>,
    self_signed: Option<bool>,
    ticket_keys: Option<PathBuf>,
    redirect_http: Option<SocketAddr>,
    /// The redirect listener's status (308 unless given)...
    redirect_http_status: Option<Spanned<u16>>,
    /// ...and the host each request goes to: `{ "www.example.com" = "example.com", "*" =
    /// "example.com" }` (`*`: every other host; default: the request's own).
    redirect_http_hosts: Option<Spanned<BTreeMap<String, String>>>,
    hsts: Option<u64>,
    /// HTTP/3 on the HTTPS listener's UDP port (default true).
    http3: Option<bool>,
    /// HTTP/3's 0-RTT early data (default false).
    http3_0rtt: Option<bool>,
    /// `[tls.acme]`: automatic HTTPS.
    acme: Option<crate::acme::FileAcme>,
}

impl FileTls {
    pub fn acme(&self) -> Option<&crate::acme::FileAcme> {
        self.acme.as_ref()
    }

    /// `redirect_http_status` and `redirect_http_hosts` as server settings, or each problem
    /// with where its key's value starts in the file.
    pub fn redirect_settings(&self) -> Result<RedirectHttp, Vec<(usize, String)>> {
        let mut problems = Vec::new();
        let mut settings = RedirectHttp::default();
        if let Some(status) = &self.redirect_http_status {
            settings.status = *status.get_ref();
            if ![301, 302, 303, 307, 308].contains(&settings.status) {
                problems.push((
                    status.span().start,
                    format!(
                        "redirect_http_status {} is not a redirect (301, 302, 303, 307 or 308)",
                        settings.status
                    ),
                ));
            }
        }
        if let Some(hosts) = &self.redirect_http_hosts {
            let at = hosts.span().start;
            for (from, to) in hosts.get_ref() {
                if !redirect_target_ok(to) {
                    problems.push((
                        at,
                        format!("redirect_http_hosts: {to:?} is not a host name (with an optional :port)"),
                    ));
                    continue;
                }
                if from == "*" {
                    settings.any = Some(to.to_ascii_lowercase());
                    continue;
                }
                match tern_vhost::normalize_pattern(from) {
                    Ok(name) if !name.starts_with('*') => {
                        settings.hosts.push((name, to.to_ascii_lowercase()))
                    }
                    _ => problems.push((
                        at,
                        format!("redirect_http_hosts: {from:?} is not a host name (or \"*\" for every other host)"),
                    )),
                }
            }
        }
        if problems.is_empty() {
            Ok(settings)
        } else {
            Err(problems)
        }
    }

    /// Whether a redirect key is given without `redirect_http` (it would do nothing).
    pub fn redirect_keys_without_listener(&self) -> Option<usize> {
        if self.redirect_http.is_some() {
            return None;
        }
        let status = self.redirect_http_status.as_ref().map(|s| s.span().start);
        status.or(self.redirect_http_hosts.as_ref().map(|h| h.span().start))
    }
}

/// A redirect target: a DNS name or an address, maybe with a port.
fn redirect_target_ok(target: &str) -> bool {
    let (host, port) = match target.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') && !h.is_empty() && h.ends_with(|c: char| c != ':') => {
            (h, Some(p))
        }
        _ => (target, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && (host.parse::<std::net::Ipv4Addr>().is_ok()
            || host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
            || tern_vhost::normalize_pattern(host).is_ok_and(|n| !n.starts_with('*')));
    host_ok && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p != 0))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileCert {
    cert: PathBuf,
    key: PathBuf,
}

/// HTTPS as resolved from flags, file and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPlan {
    pub options: TlsOptions,
    pub listen: SocketAddr,
    pub redirect_http: Option<SocketAddr>,
    /// What the redirect listener answers.
    pub redirect: RedirectHttp,
    pub hsts: Option<u64>,
    /// HTTP/3 on the HTTPS listener's UDP port.
    pub http3: bool,
}

impl TlsArgs {
    /// `None` when TLS is off (no certificate and no self-signed one). Flags win over the
    /// file; relative paths in the file are taken from `file_dir`.
    pub fn plan(
        &self,
        file: Option<&FileTls>,
        file_dir: &Path,
        default_ticket_keys: Option<PathBuf>,
    ) -> Result<Option<TlsPlan>, String> {
        if self.certs.len() != self.keys.len() {
            return Err(format!(
                "--tls-cert and --tls-key come in pairs ({} certificates, {} keys)",
                self.certs.len(),
                self.keys.len()
            ));
        }
        let empty = FileTls::default();
        let f = file.unwrap_or(&empty);
        let mut certs: Vec<CertFiles> = self
            .certs
            .iter()
            .zip(&self.keys)
            .map(|(cert, key)| CertFiles {
                cert: cert.clone(),
                key: key.clone(),
            })
            .collect();
        if certs.is_empty() {
            certs = f
                .certificates
                .iter()
                .map(|c| CertFiles {
                    cert: file_dir.join(&c.cert),
                    key: file_dir.join(&c.key),
                })
                .collect();
        }
        let acme = self.acme || f.acme.is_some();
        // With ACME, the self-signed certificate is what a name gets until its own is issued.
        let self_signed = self.tls_self_signed || f.self_signed.unwrap_or(false) || acme;
        if certs.is_empty() && !self_signed {
            let asked =
                self.listen_tls.is_some() || self.redirect_http.is_some() || self.hsts.is_some();
            if asked || f.listen.is_some() {
                return Err("HTTPS needs a certificate: give --tls-cert and --tls-key (or --tls-self-signed)".into());
            }
            return Ok(None);
        }
        let ticket_keys = self
            .tls_ticket_keys
            .clone()
            .or_else(|| f.ticket_keys.as_ref().map(|p| file_dir.join(p)))
            .or(default_ticket_keys);
        Ok(Some(TlsPlan {
            options: TlsOptions {
                certs,
                self_signed,
                ticket_keys,
                // HTTP/2 preferred; a client that offers neither gets HTTP/1.1 too.
                alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
                acme,
                quic_early_data: self.http3_0rtt || f.http3_0rtt.unwrap_or(false),
            },
            listen: self
                .listen_tls
                .or(f.listen)
                .unwrap_or_else(|| DEFAULT_LISTEN_TLS.parse().expect("a valid address")),
            redirect_http: self.redirect_http.or(f.redirect_http),
            redirect: f.redirect_settings().map_err(|problems| {
                let list: Vec<String> = problems.into_iter().map(|(_, p)| p).collect();
                list.join("; ")
            })?,
            hsts: self.hsts.or(f.hsts),
            http3: !self.no_http3 && f.http3.unwrap_or(true),
        }))
    }
}

/// Sets the listeners: plain HTTP (always without TLS; with TLS only when asked for), HTTPS,
/// and the redirect listener.
pub fn configure(
    config: &mut ServerConfig,
    plain: SocketAddr,
    plain_given: bool,
    plan: Option<&TlsPlan>,
) {
    let Some(plan) = plan else {
        config.runtime.listen = vec![plain];
        config.listener_kinds = vec![ListenerKind::Http];
        return;
    };
    let mut listen = Vec::new();
    let mut kinds = Vec::new();
    if plain_given {
        listen.push(plain);
        kinds.push(ListenerKind::Http);
    }
    listen.push(plan.listen);
    kinds.push(ListenerKind::Https);
    if let Some(addr) = plan.redirect_http {
        listen.push(addr);
        kinds.push(ListenerKind::RedirectToHttps);
    }
    config.runtime.listen = listen;
    config.listener_kinds = kinds;
    config.hsts_max_age = plan.hsts;
    config.http3 = plan.http3;
    config.redirect_http = plan.redirect.clone();
}

/// Loads the certificates (and ticket keys); errors are one line for the start-up message.
pub fn acceptor(plan: &TlsPlan) -> Result<Arc<TlsAcceptor>, String> {
    TlsAcceptor::new(&plan.options)
        .map(Arc::new)
        .map_err(|e| format!("TLS: {e}"))
}

/// `http://A and https://B and http://C (redirect to https)` for the start-up line.
pub fn describe_listeners(addrs: &[SocketAddr], kinds: &[ListenerKind]) -> String {
    addrs
        .iter()
        .enumerate()
        .map(
            |(i, addr)| match kinds.get(i).copied().unwrap_or(ListenerKind::Http) {
                ListenerKind::Http => format!("http://{addr}"),
                ListenerKind::Https => format!("https://{addr}"),
                ListenerKind::RedirectToHttps => format!("http://{addr} (redirect to https)"),
            },
        )
        .collect::<Vec<_>>()
        .join(" and ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        tls: TlsArgs,
    }

    fn args(a: &[&str]) -> TlsArgs {
        let mut argv = vec!["t"];
        argv.extend_from_slice(a);
        TestCli::parse_from(argv).tls
    }

    #[test]
    fn no_certificate_means_no_tls_unless_tls_was_asked_for() {
        assert_eq!(args(&[]).plan(None, Path::new(""), None).unwrap(), None);
        let e = args(&["--listen-tls", "127.0.0.1:0"])
            .plan(None, Path::new(""), None)
            .unwrap_err();
        assert!(e.contains("needs a certificate"), "{e}");
        let e = args(&["--tls-cert", "a.pem"])
            .plan(None, Path::new(""), None)
            .unwrap_err();
        assert!(e.contains("pairs"), "{e}");
    }

    #[test]
    fn flags_win_over_the_file_and_file_paths_are_relative_to_it() {
        let file: FileTls = toml::from_str(
            "listen = \"127.0.0.1:9443\"\nhsts = 60\nticket_keys = \"k\"\n[[certificates]]\ncert = \"c.pem\"\nkey = \"c.key\"\n",
        )
        .unwrap();
        let plan = args(&[])
            .plan(Some(&file), Path::new("/etc/tern"), None)
            .unwrap()
            .unwrap();
        assert_eq!(plan.listen.port(), 9443);
        assert_eq!(plan.hsts, Some(60));
        assert_eq!(plan.options.certs[0].cert, PathBuf::from("/etc/tern/c.pem"));
        assert_eq!(plan.options.ticket_keys, Some(PathBuf::from("/etc/tern/k")));
        let plan = args(&[
            "--tls-cert",
            "x.pem",
            "--tls-key",
            "x.key",
            "--listen-tls",
            "127.0.0.1:1",
        ])
        .plan(Some(&file), Path::new("/etc/tern"), None)
        .unwrap()
        .unwrap();
        assert_eq!(plan.listen.port(), 1);
        assert_eq!(plan.options.certs.len(), 1);
        assert_eq!(plan.options.certs[0].cert, PathBuf::from("x.pem"));
        assert!(toml::from_str::<FileTls>("bogus = 1").is_err());
    }

    #[test]
    fn plain_http_only_when_asked_for_once_tls_is_on() {
        let plan = args(&["--tls-self-signed", "--redirect-http", "127.0.0.1:0"])
            .plan(None, Path::new(""), None)
            .unwrap()
            .unwrap();
        let plain: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let mut c = ServerConfig::default();
        configure(&mut c, plain, false, Some(&plan));
        assert_eq!(
            c.listener_kinds,
            vec![ListenerKind::Https, ListenerKind::RedirectToHttps]
        );
        configure(&mut c, plain, true, Some(&plan));
        assert_eq!(c.listener_kinds[0], ListenerKind::Http);
        assert_eq!(c.runtime.listen[0], plain);
    }
}
