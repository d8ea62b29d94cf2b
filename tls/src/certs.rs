//! Loading certificate chains and keys from PEM files, and the names a certificate serves.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// One certificate chain with its key, ready for handshakes, and the DNS names it covers.
#[derive(Debug, Clone)]
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    /// Lowercase DNS names from the leaf's subjectAltName (`*.example.org` for wildcards);
    /// the subject's CN when there is no DNS name in the SAN.
    pub names: Vec<String>,
}

/// Reads a PEM chain (leaf first) and a PEM private key (PKCS#8, SEC1 or PKCS#1; ECDSA P-256,
/// P-384, RSA or Ed25519) and checks that the key belongs to the leaf.
pub fn load_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<LoadedCert, String> {
    let chain = read_chain(cert)?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        format!(
            "cannot read a private key from {}: {}",
            key.display(),
            pem_error(e)
        )
    })?;
    from_der(chain, key_der, provider)
        .map_err(|e| format!("{} with {}: {e}", cert.display(), key.display()))
}

/// Builds a [`LoadedCert`] from DER (used for files and for the self-signed certificate).
pub fn from_der(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &CryptoProvider,
) -> Result<LoadedCert, String> {
    let leaf = chain
        .first()
        .ok_or("the certificate file holds no certificate")?;
    let names = dns_names(leaf)?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("unusable private key: {e}"))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err("the private key does not belong to the certificate".into())
        }
        Err(e) => return Err(format!("cannot check the key against the certificate: {e}")),
    }
    Ok(LoadedCert {
        key: Arc::new(certified),
        names,
    })
}

pub(crate) fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let iter = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {}: {}", path.display(), pem_error(e)))?;
    let chain = iter
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("bad certificate in {}: {}", path.display(), pem_error(e)))?;
    if chain.is_empty() {
        return Err(format!("no certificate (PEM) in {}", path.display()));
    }
    Ok(chain)
}

fn pem_error(e: rustls_pki_types::pem::Error) -> String {
    match e {
        rustls_pki_types::pem::Error::Io(io) => io.to_string(),
        rustls_pki_types::pem::Error::NoItemsFound => "no PEM item of the right kind".into(),
        other => format!("{other:?}"),
    }
}

/// The DNS names of a leaf certificate, lowercased.
fn dns_names(leaf: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| format!("cannot parse the certificate: {e}"))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(n) = name {
                names.push(n.to_ascii_lowercase());
            }
        }
    }
    if names.is_empty() {
        for cn in cert.subject().iter_common_name() {
            if let Ok(s) = cn.as_str() {
                names.push(s.to_ascii_lowercase());
            }
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> CryptoProvider {
        rustls::crypto::aws_lc_rs::default_provider()
    }

    fn write(dir: &Path, name: &str, data: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        p
    }

    #[test]
    fn names_come_from_the_san_and_a_mismatched_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = rcgen::generate_simple_self_signed(vec!["A.example.org".into(), "*.b.org".into()])
            .unwrap();
        let b = rcgen::generate_simple_self_signed(vec!["other".into()]).unwrap();
        let cert = write(dir.path(), "a.pem", &a.cert.pem());
        let key = write(dir.path(), "a.key", &a.signing_key.serialize_pem());
        let other_key = write(dir.path(), "b.key", &b.signing_key.serialize_pem());
        let loaded = load_pair(&cert, &key, &provider()).unwrap();
        assert_eq!(loaded.names, vec!["a.example.org", "*.b.org"]);
        let err = load_pair(&cert, &other_key, &provider()).unwrap_err();
        assert!(err.contains("does not belong"), "{err}");
        let err = load_pair(&key, &key, &provider()).unwrap_err();
        assert!(err.contains("no certificate"), "{err}");
        let err = load_pair(&dir.path().join("missing"), &key, &provider()).unwrap_err();
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn rsa_pkcs1_and_ec_sec1_keys_load() {
        // SEC1 ("EC PRIVATE KEY") and PKCS#1 ("RSA PRIVATE KEY") files come from the openssl CLI.
        let dir = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let ok = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .stderr(std::process::Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "openssl {args:?}");
        };
        run(&[
            "ecparam",
            "-name",
            "secp384r1",
            "-genkey",
            "-noout",
            "-out",
            "ec.key",
        ]);
        run(&[
            "req",
            "-new",
            "-x509",
            "-key",
            "ec.key",
            "-subj",
            "/CN=ec.test",
            "-days",
            "30",
            "-out",
            "ec.pem",
        ]);
        run(&["genrsa", "-traditional", "-out", "rsa.key", "2048"]);
        run(&[
            "req",
            "-new",
            "-x509",
            "-key",
            "rsa.key",
            "-subj",
            "/CN=rsa.test",
            "-days",
            "30",
            "-out",
            "rsa.pem",
        ]);
        let ec = std::fs::read_to_string(dir.path().join("ec.key")).unwrap();
        assert!(ec.contains("BEGIN EC PRIVATE KEY"));
        let rsa = std::fs::read_to_string(dir.path().join("rsa.key")).unwrap();
        assert!(rsa.contains("BEGIN RSA PRIVATE KEY"));
        let p = |n: &str| dir.path().join(n);
        let ec = load_pair(&p("ec.pem"), &p("ec.key"), &provider()).unwrap();
        assert_eq!(ec.names, vec!["ec.test"]);
        let rsa = load_pair(&p("rsa.pem"), &p("rsa.key"), &provider()).unwrap();
        assert_eq!(rsa.names, vec!["rsa.test"]);
    }
}
