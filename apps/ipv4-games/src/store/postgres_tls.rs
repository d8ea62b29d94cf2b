//! TLS to PostgreSQL as libpq users know it: `sslmode` and `sslrootcert` in the URL (or
//! `PGSSLMODE` / `PGSSLROOTCERT` when the URL has none), over rustls with tern's crypto
//! provider (`tokio-postgres-rustls` plugs it into rust-postgres).
//!
//! | `sslmode`          | TLS                                   | certificate checked        |
//! |--------------------|---------------------------------------|----------------------------|
//! | `disable`          | never                                 | –                          |
//! | `prefer` (default) | if the server offers it, else plain   | no                         |
//! | `require`          | always                                | chain, if a root is given* |
//! | `verify-ca`        | always                                | chain against the roots    |
//! | `verify-full`      | always                                | chain and host name        |
//!
//! The roots: `sslrootcert=FILE` (PEM), else `~/.postgresql/root.crt` (libpq's default;
//! `verify-*` refuse to start without one); *`require` with a root checks the chain as
//! `verify-ca` does, as libpq. `sslrootcert=system` takes the system's roots and, as libpq,
//! makes `verify-full` the default and refuses weaker modes (anyone can get a publicly
//! trusted certificate for a name they hold). `prefer` also goes plain when the TLS
//! handshake itself fails (libpq's retry). Over Unix sockets TLS is never used (as libpq).
//!
//! rust-postgres knows only `disable`, `prefer` and `require`, and neither `sslrootcert`:
//! those parameters are taken off the URL here and the rest is left to `postgres::Config`.
//! Files are read once, at start-up: later connections are made inside the sandbox.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use percent_encoding::percent_decode_str;
use postgres::config::SslMode as PgSslMode;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode` values, `allow` aside (rust-postgres cannot try plain first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(value: &str) -> Result<SslMode, String> {
        match value {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            other => Err(format!(
                "sslmode={other:?} is not supported: use disable, prefer, require, verify-ca or \
                 verify-full"
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// A URL with libpq's TLS parameters taken off: `url` is what rust-postgres parses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsParams {
    pub url: String,
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
}

/// Takes `sslmode` and `sslrootcert` off the query of a `postgres://` URL (read the way
/// rust-postgres reads it: the credentials end at the first `@`, the query starts at the next
/// `?`, parameters are `&`-separated and percent-encoded; the last of a repeated one wins).
/// Anything else (a `key=value` string) is returned as it is.
pub fn split_url(url: &str) -> Result<TlsParams, String> {
    let mut params = TlsParams {
        url: url.to_string(),
        sslmode: None,
        sslrootcert: None,
    };
    let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    else {
        return Ok(params);
    };
    let after_credentials = rest.find('@').map_or(0, |at| at + 1);
    let Some(q) = rest[after_credentials..].find('?') else {
        return Ok(params);
    };
    let query_at = url.len() - rest.len() + after_credentials + q;
    let mut kept = Vec::new();
    for pair in url[query_at + 1..].split('&') {
        let Some((key, value)) = pair.split_once('=') else {
            kept.push(pair); // rust-postgres says what is wrong with it
            continue;
        };
        let decode = |s: &str| {
            percent_decode_str(s)
                .decode_utf8()
                .map(|v| v.into_owned())
                .map_err(|_| format!("the URL parameter {key:?} is not UTF-8"))
        };
        match decode(key)?.as_str() {
            "sslmode" => params.sslmode = Some(decode(value)?),
            "sslrootcert" => params.sslrootcert = Some(decode(value)?),
            _ => kept.push(pair),
        }
    }
    params.url = if kept.is_empty() {
        url[..query_at].to_string()
    } else {
        format!("{}?{}", &url[..query_at], kept.join("&"))
    };
    Ok(params)
}

/// Where the roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    File(PathBuf),
    System,
}

/// What the connections do, settled at start-up.
#[derive(Clone)]
pub struct Tls {
    /// What rust-postgres is told: `Disable`, `Prefer` or `Require`.
    pub mode: PgSslMode,
    /// `None` with `Disable`.
    pub connector: Option<MakeRustlsConnect>,
    /// For logs and `--check`: e.g. "verify-full: chain and host name checked against FILE".
    pub summary: String,
}

/// The environment the settings come from besides the URL (a parameter for the tests).
pub struct Env {
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
    pub home: Option<PathBuf>,
}

impl Env {
    pub fn process() -> Env {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        Env {
            sslmode: var("PGSSLMODE"),
            sslrootcert: var("PGSSLROOTCERT"),
            home: var("HOME").map(PathBuf::from),
        }
    }
}

/// The mode `params` and `env` ask for, and the roots named (not read): checks what can be
/// checked without reading files (for `tern run --check` and the sandbox's plan).
fn requested(params: &TlsParams, env: &Env) -> Result<(SslMode, Option<Roots>), String> {
    let roots = params
        .sslrootcert
        .clone()
        .or_else(|| env.sslrootcert.clone())
        .filter(|r| !r.is_empty())
        .map(|r| match r.as_str() {
            "system" => Roots::System,
            _ => Roots::File(PathBuf::from(r)),
        });
    let mode = match params.sslmode.as_deref().or(env.sslmode.as_deref()) {
        Some(value) => SslMode::parse(value)?,
        None if roots == Some(Roots::System) => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if roots == Some(Roots::System) && mode != SslMode::VerifyFull {
        return Err(format!(
            "sslrootcert=system needs sslmode=verify-full, not {}: any public CA would vouch for \
             whoever holds a name",
            mode.name()
        ));
    }
    Ok((mode, roots))
}

/// Checks the TLS parameters of `params` without reading any file.
pub fn check(params: &TlsParams) -> Result<(), String> {
    requested(params, &Env::process()).map(|_| ())
}

/// The TLS settings for `params`, root certificates read now. `unix_only`: every host is a
/// Unix socket, where TLS is never used.
pub fn settle(params: &TlsParams, env: &Env, unix_only: bool) -> Result<Tls, String> {
    let (mode, roots) = requested(params, env)?;
    if mode == SslMode::Disable || unix_only {
        return Ok(Tls {
            mode: PgSslMode::Disable,
            connector: None,
            summary: if unix_only {
                "disable: no TLS over a Unix socket".into()
            } else {
                "disable".into()
            },
        });
    }
    let provider = Arc::new(tern_tls::crypto_provider());
    let algorithms = provider.signature_verification_algorithms;
    let default_file = env
        .home
        .as_ref()
        .map(|home| home.join(".postgresql/root.crt"));
    // libpq's default file counts only where it exists (for `verify-*`, its absence is said).
    let roots = roots.or_else(|| {
        default_file
            .as_ref()
            .filter(|f| mode != SslMode::Prefer && f.exists())
            .map(|f| Roots::File(f.clone()))
    });
    let (verifier, checked): (Arc<dyn ServerCertVerifier>, String) = match (mode, roots) {
        // (`Disable` returned above.)
        (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => (
            Arc::new(NoCertificateCheck(algorithms)),
            "certificate not checked".into(),
        ),
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(format!(
                "sslmode={} needs the CA certificate of the database: give sslrootcert=FILE \
                 (or sslrootcert=system){}",
                mode.name(),
                match &default_file {
                    Some(f) => format!(" or put it in {}", f.display()),
                    None => String::new(),
                }
            ))
        }
        (SslMode::Require | SslMode::VerifyCa, Some(roots)) => (
            Arc::new(ChainOnly {
                roots: Arc::new(read_roots(&roots)?),
                algorithms,
            }),
            format!("chain checked against {}", describe(&roots)),
        ),
        (SslMode::VerifyFull, Some(roots)) => (
            WebPkiServerVerifier::builder_with_provider(
                Arc::new(read_roots(&roots)?),
                provider.clone(),
            )
            .build()
            .map_err(|e| format!("{}: {e}", describe(&roots)))?,
            format!("chain and host name checked against {}", describe(&roots)),
        ),
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS configuration: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    // As libpq 17 does; PostgreSQL 17 needs it for sslnegotiation=direct.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Tls {
        mode: if mode == SslMode::Prefer {
            PgSslMode::Prefer
        } else {
            PgSslMode::Require
        },
        connector: Some(MakeRustlsConnect::new(config)),
        summary: format!("{}: {checked}", mode.name()),
    })
}

fn describe(roots: &Roots) -> String {
    match roots {
        Roots::File(f) => f.display().to_string(),
        Roots::System => "the system's roots".into(),
    }
}

fn read_roots(roots: &Roots) -> Result<RootCertStore, String> {
    match roots {
        Roots::File(file) => read_root_file(file),
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let mut store = RootCertStore::empty();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(match found.errors.first() {
                    Some(e) => format!("sslrootcert=system: no system CA certificate read: {e}"),
                    None => "sslrootcert=system: no system CA certificate found".into(),
                });
            }
            Ok(store)
        }
    }
}

fn read_root_file(file: &Path) -> Result<RootCertStore, String> {
    let certs = CertificateDer::pem_file_iter(file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read sslrootcert {}: {e}", file.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "sslrootcert {} holds no PEM certificate",
            file.display()
        ));
    }
    let mut store = RootCertStore::empty();
    for cert in certs {
        store
            .add(cert)
            .map_err(|e| format!("sslrootcert {}: unusable certificate: {e}", file.display()))?;
    }
    Ok(store)
}

/// `prefer`, and `require` without roots: any certificate. The handshake's signature is still
/// checked against the certificate's key, so that SCRAM's channel binding (which hashes the
/// certificate) is bound to a server that holds that key.
#[derive(Debug)]
struct NoCertificateCheck(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoCertificateCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `verify-ca`: the chain up to one of `roots` and the validity dates, not the name.
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Env {
        Env {
            sslmode: None,
            sslrootcert: None,
            home: None,
        }
    }

    fn split(url: &str) -> TlsParams {
        split_url(url).unwrap()
    }

    #[test]
    fn the_tls_parameters_come_off_the_url_and_the_rest_stays() {
        let p = split("postgres://u:p@h:5432/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem");
        assert_eq!(p.url, "postgres://u:p@h:5432/db");
        assert_eq!(p.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(p.sslrootcert.as_deref(), Some("/etc/ca.pem"));
        let p = split(
            "postgresql://h1,h2/db?target_session_attrs=read-write&sslmode=require&hostaddr=10.0.0.1",
        );
        assert_eq!(
            p.url,
            "postgresql://h1,h2/db?target_session_attrs=read-write&hostaddr=10.0.0.1"
        );
        assert_eq!(p.sslmode.as_deref(), Some("require"));
        // A `?` or `&` in the password is not the query; the last of a repeated key wins.
        let p = split("postgres://u:a?sslmode=disable&x@h/db?sslmode=prefer&sslmode=verify-ca");
        assert_eq!(p.url, "postgres://u:a?sslmode=disable&x@h/db");
        assert_eq!(p.sslmode.as_deref(), Some("verify-ca"));
        // No query, no TLS parameter, a key=value string: unchanged.
        for url in [
            "postgres://u@h/db",
            "postgres://u@h/db?application_name=x",
            "host=h sslmode=require",
        ] {
            assert_eq!(split(url).url, url);
            assert_eq!(split(url).sslmode, None);
        }
        // What is left still parses.
        let p = split("postgres://u@h:1/db?sslmode=verify-ca&connect_timeout=3");
        assert!(p.url.parse::<postgres::Config>().is_ok(), "{}", p.url);
        assert!(split_url("postgres://h/db?sslmode=%ff").is_err());
    }

    #[test]
    fn modes_as_libpq_has_them() {
        let mode = |url: &str, env: &Env| requested(&split(url), env).map(|(m, _)| m);
        assert_eq!(mode("postgres://h/db", &env()), Ok(SslMode::Prefer));
        for (value, expected) in [
            ("disable", SslMode::Disable),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            assert_eq!(
                mode(&format!("postgres://h/db?sslmode={value}"), &env()),
                Ok(expected)
            );
        }
        for bad in ["allow", "VERIFY-FULL", "", "true"] {
            let e = mode(&format!("postgres://h/db?sslmode={bad}"), &env()).unwrap_err();
            assert!(e.contains("is not supported"), "{e}");
        }
        // The environment fills in what the URL does not say.
        let from_env = Env {
            sslmode: Some("require".into()),
            ..env()
        };
        assert_eq!(mode("postgres://h/db", &from_env), Ok(SslMode::Require));
        assert_eq!(
            mode("postgres://h/db?sslmode=disable", &from_env),
            Ok(SslMode::Disable)
        );
        // sslrootcert=system: verify-full by default, and nothing weaker.
        assert_eq!(
            mode("postgres://h/db?sslrootcert=system", &env()),
            Ok(SslMode::VerifyFull)
        );
        let e = mode(
            "postgres://h/db?sslrootcert=system&sslmode=verify-ca",
            &env(),
        )
        .unwrap_err();
        assert!(e.contains("needs sslmode=verify-full"), "{e}");
    }

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn roots_are_read_at_start_up_and_their_absence_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let settle_url = |url: &str, env: &Env| settle(&split(url), env, false);
        // verify-* need roots; the message names the file libpq would have read.
        let home = Env {
            home: Some(dir.path().to_path_buf()),
            ..env()
        };
        let e = settle_url("postgres://h/db?sslmode=verify-full", &home)
            .err()
            .unwrap();
        assert!(
            e.contains("needs the CA certificate") && e.contains(".postgresql/root.crt"),
            "{e}"
        );
        let missing = dir.path().join("missing.pem");
        let e = settle_url(
            &format!(
                "postgres://h/db?sslmode=verify-ca&sslrootcert={}",
                missing.display()
            ),
            &env(),
        )
        .err()
        .unwrap();
        assert!(e.starts_with("cannot read sslrootcert"), "{e}");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let e = settle_url(
            &format!(
                "postgres://h/db?sslmode=require&sslrootcert={}",
                junk.display()
            ),
            &env(),
        )
        .err()
        .unwrap();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        // require: the chain is checked once a root is there, libpq's default file included.
        let tls = settle_url("postgres://h/db?sslmode=require", &home).unwrap();
        assert!(tls.summary.contains("not checked"), "{}", tls.summary);
        std::fs::create_dir(dir.path().join(".postgresql")).unwrap();
        std::fs::write(dir.path().join(".postgresql/root.crt"), ca_pem()).unwrap();
        let tls = settle_url("postgres://h/db?sslmode=require", &home).unwrap();
        assert_eq!(tls.mode, PgSslMode::Require);
        assert!(tls.summary.contains("chain checked"), "{}", tls.summary);
        let tls = settle_url("postgres://h/db?sslmode=verify-full", &home).unwrap();
        assert!(tls.summary.contains("host name"), "{}", tls.summary);
        // prefer never checks (and never fails on a bad root); disable and sockets: no TLS.
        let tls = settle_url(
            &format!("postgres://h/db?sslrootcert={}", junk.display()),
            &env(),
        )
        .unwrap();
        assert_eq!(tls.mode, PgSslMode::Prefer);
        let tls = settle_url("postgres://h/db?sslmode=disable", &env()).unwrap();
        assert!(tls.connector.is_none() && tls.mode == PgSslMode::Disable);
        let tls = settle(
            &split("postgres://%2Frun%2Fpostgresql/db?sslmode=verify-full"),
            &env(),
            true,
        )
        .unwrap();
        assert!(tls.connector.is_none() && tls.mode == PgSslMode::Disable);
    }
}
