//! TLS toward upstream servers (the reverse proxy as a TLS client): the rustls client
//! configuration of a proxy route, built once when the config is read (files are read before
//! the sandbox applies), and the short cause of a failed handshake for logs and counters.
//! The connection itself is driven sans-IO by the server's upstream pool.

use std::path::Path;
use std::sync::Arc;

use rustls::{CertificateError, ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::{crypto_provider, CertFiles};

/// What a proxy route's TLS client trusts and shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamTlsOptions {
    /// PEM file of the certificate authorities to trust; `None`: the system's roots.
    pub ca: Option<std::path::PathBuf>,
    /// A client certificate and key, for upstreams that require one (mutual TLS).
    pub client_cert: Option<CertFiles>,
}

/// The route's client configuration: TLS 1.3 and 1.2 (tern's suites), ALPN `http/1.1`,
/// certificates verified (chain, validity, name) against `options.ca` or the system's roots.
/// Session resumption is rustls's default: an in-memory cache of 256 sessions shared by every
/// connection made with this configuration (tickets for TLS 1.3, ids for 1.2).
pub fn client_config(options: &UpstreamTlsOptions) -> Result<Arc<ClientConfig>, String> {
    let roots = match &options.ca {
        Some(path) => ca_file(path)?,
        None => system_roots()?,
    };
    let builder = ClientConfig::builder_with_provider(Arc::new(crypto_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS configuration: {e}"))?
        .with_root_certificates(roots);
    let mut config = match &options.client_cert {
        None => builder.with_no_client_auth(),
        Some(files) => {
            let chain = crate::certs::read_chain(&files.cert)?;
            let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
                format!(
                    "cannot read a private key from {}: {e}",
                    files.key.display()
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                format!("{} with {}: {e}", files.cert.display(), files.key.display())
            })?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn ca_file(path: &Path) -> Result<RootCertStore, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("{}: unusable CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}

/// The system's trusted roots (Debian: /etc/ssl/certs), read once at start-up.
fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(match found.errors.first() {
            Some(e) => format!("no system CA certificates could be read ({e}); give proxy_tls_ca"),
            None => "no system CA certificates found; give proxy_tls_ca".into(),
        });
    }
    Ok(roots)
}

/// Why a handshake with an upstream failed, in a few words (a label value: a small fixed set).
pub fn failure_cause(e: &rustls::Error) -> &'static str {
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => "unknown_ca",
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "name_mismatch"
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => "expired",
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "not_yet_valid"
            }
            CertificateError::Revoked => "revoked",
            _ => "bad_certificate",
        },
        rustls::Error::AlertReceived(_) => "alert_received",
        rustls::Error::NoApplicationProtocol => "no_alpn",
        _ => "protocol_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_files_must_hold_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let options = UpstreamTlsOptions {
            ca: Some(empty.clone()),
            client_cert: None,
        };
        let e = client_config(&options).unwrap_err();
        assert!(e.contains("holds no certificate"), "{e}");
        let options = UpstreamTlsOptions {
            ca: Some(dir.path().join("missing.pem")),
            client_cert: None,
        };
        assert!(client_config(&options).unwrap_err().contains("cannot read"));
    }

    #[test]
    fn causes_are_named() {
        let e = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert_eq!(failure_cause(&e), "unknown_ca");
        let e = rustls::Error::InvalidCertificate(CertificateError::Expired);
        assert_eq!(failure_cause(&e), "expired");
    }
}
