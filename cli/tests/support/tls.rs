//! Helpers for the HTTPS end-to-end tests (`tests/https.rs`), on top of `support` (whose
//! `Tern` runs the server): a test CA and certificates made with rcgen, rustls client
//! configurations, and `tern serve`/`tern demo` started with an HTTPS listener. The TLS
//! client itself (`TlsClient`) and the accept-any verifier are tern-testkit's.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};
pub use tern_testkit::tls::client_hello;
pub use tern_testkit::{AnyCert, TlsClient};

use crate::support::{demo_command, serve_command, Tern};

// ---------------------------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------------------------

/// A test certificate authority (ECDSA P-256) that signs leaf certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and its key, as PEM and DER.
#[derive(Clone)]
pub struct Leaf {
    /// The subject's common name, to tell certificates apart in messages.
    pub label: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new() -> Ca {
        Ca::named("tern test CA")
    }

    /// A CA with its own common name (two CAs of one name are told apart only by signature).
    pub fn named(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// Writes the CA certificate as `dir/ca.pem` (for curl and openssl).
    pub fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.pem()).unwrap();
        path
    }

    /// A leaf for `names` (DNS names or IP addresses) with common name `label`.
    pub fn issue(&self, label: &str, names: &[&str]) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, label);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            label: label.to_owned(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// Roots trusting only this CA.
    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.der()).unwrap();
        roots
    }
}

impl Leaf {
    /// Writes `dir/STEM.pem` (the chain: the leaf) and `dir/STEM.key`; returns both paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}.key"));
        self.write_to(&cert, &key);
        (cert, key)
    }

    /// Writes the certificate and key over `cert` and `key` (each replaced atomically).
    pub fn write_to(&self, cert: &Path, key: &Path) {
        replace_file(cert, self.cert_pem.as_bytes());
        replace_file(key, self.key_pem.as_bytes());
    }
}

/// Writes `data` to a temporary file beside `path` and renames it over `path`.
pub fn replace_file(path: &Path, data: &[u8]) {
    let tmp = path.with_extension("writing");
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `--tls-cert CERT --tls-key KEY`.
pub fn cert_key_args(cert: &Path, key: &Path) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        cert.to_str().unwrap().into(),
        "--tls-key".into(),
        key.to_str().unwrap().into(),
    ]
}

/// Which of `leaves` a connection's server certificate is (by DER), as its label.
pub fn which<'a>(got: &CertificateDer<'_>, leaves: &[&'a Leaf]) -> &'a str {
    leaves
        .iter()
        .find(|l| l.der.as_ref() == got.as_ref())
        .map(|l| l.label.as_str())
        .unwrap_or("an unknown certificate")
}

// ---------------------------------------------------------------------------------------------
// Client configurations
// ---------------------------------------------------------------------------------------------

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(aws_lc_rs::default_provider())
}

pub const TLS13: &SupportedProtocolVersion = &rustls::version::TLS13;
pub const TLS12: &SupportedProtocolVersion = &rustls::version::TLS12;

/// A client trusting only `ca`, limited to `versions`, offering ALPN `http/1.1`, with an
/// in-memory session cache (so a second connection from the same config tries to resume).
pub fn client_config(ca: &Ca, versions: &[&'static SupportedProtocolVersion]) -> ClientConfig {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// A client that accepts any certificate (whose signatures still have to check out), for the
/// SNI tests, where a certificate that does not match the name asked for is the point.
pub fn any_cert_config(versions: &[&'static SupportedProtocolVersion]) -> ClientConfig {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert::with_provider(provider())))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

// ---------------------------------------------------------------------------------------------
// The server process
// ---------------------------------------------------------------------------------------------

/// `--listen-tls 127.0.0.1:0`: an HTTPS listener on a free port.
pub const LISTEN_TLS: &[&str] = &["--listen-tls", "127.0.0.1:0"];

impl Tern {
    /// `tern serve DIR --listen-tls 127.0.0.1:0 --workers 2 EXTRA...` (plain HTTP too only if
    /// EXTRA has `--listen`), waiting for the start-up line.
    pub fn serve_tls<S: AsRef<OsStr>>(dir: &Path, extra: &[S]) -> Tern {
        Tern::spawn(serve_command(dir, LISTEN_TLS, extra))
    }

    /// `tern demo --data DATA --listen-tls 127.0.0.1:0 --workers 2 EXTRA...`.
    pub fn demo_tls<S: AsRef<OsStr>>(data: &Path, extra: &[S]) -> Tern {
        Tern::spawn(demo_command(data, LISTEN_TLS, extra))
    }

    /// A TLS connection to the HTTPS listener, as `name`.
    pub fn tls(&self, config: &Arc<ClientConfig>, name: &str) -> TlsClient {
        TlsClient::connect_tls(self.https(), config, name)
    }
}
