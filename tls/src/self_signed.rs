//! `--tls-self-signed`: a certificate for local development, made at start-up.

use rustls::crypto::CryptoProvider;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::certs::{self, LoadedCert};

/// An ECDSA P-256 certificate for localhost, 127.0.0.1 and ::1, and its SHA-256 fingerprint
/// (`AB:CD:...`, as browsers show it).
pub fn make(provider: &CryptoProvider) -> Result<(LoadedCert, String), String> {
    let names = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| format!("cannot make a self-signed certificate: {e}"))?;
    let der: CertificateDer<'static> = made.cert.der().clone();
    let fingerprint = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der.as_ref())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":");
    let key = PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    Ok((certs::from_der(vec![der], key, provider)?, fingerprint))
}
