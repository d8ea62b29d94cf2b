//! Choosing a certificate by SNI: exact names, then `*.` wildcards, then the default.
//!
//! rustls's own `ResolvesServerCertUsingSni` matches exact names only and aborts the handshake
//! of a client that sends no SNI (or an unknown name); a public server must answer those with
//! its default certificate, as nginx and h2o do. The set sits behind an `ArcSwap` so that a
//! reload (SIGHUP) swaps certificates for new handshakes while open connections keep theirs.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::acme::{AcmeCerts, ACME_TLS_ALPN};
use crate::certs::LoadedCert;

/// Certificates by name. The first one given is the default.
#[derive(Debug)]
pub struct CertSet {
    default: Arc<CertifiedKey>,
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.org` is stored under `example.org`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
}

impl CertSet {
    pub fn new(certs: Vec<LoadedCert>) -> Result<CertSet, String> {
        let default = certs.first().ok_or("no certificate given")?.key.clone();
        let (mut exact, mut wildcard) = (HashMap::new(), HashMap::new());
        for cert in certs {
            for name in &cert.names {
                // The first certificate naming a host wins, as the first server block in nginx.
                match name.strip_prefix("*.") {
                    Some(parent) => wildcard.entry(parent.to_string()),
                    None => exact.entry(name.clone()),
                }
                .or_insert_with(|| cert.key.clone());
            }
        }
        Ok(CertSet {
            default,
            exact,
            wildcard,
        })
    }

    /// The certificate for a client's SNI (already lowercase ASCII: rustls validates it as a
    /// DNS name and lowercases it).
    pub fn pick(&self, sni: Option<&str>) -> &Arc<CertifiedKey> {
        let Some(name) = sni else {
            return &self.default;
        };
        if let Some(key) = self.exact.get(name) {
            return key;
        }
        // A wildcard covers exactly one label: *.example.org matches a.example.org only.
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(key) = self.wildcard.get(parent) {
                return key;
            }
        }
        &self.default
    }
}

/// The resolver rustls calls during each handshake. Certificates from ACME come first for
/// the names they cover; a reload (SIGHUP) replaces the file certificates and keeps them.
#[derive(Debug)]
pub struct SniResolver {
    set: ArcSwap<CertSet>,
    /// Present when automatic HTTPS is on.
    acme: Option<AcmeCerts>,
}

impl SniResolver {
    pub fn new(set: CertSet) -> SniResolver {
        SniResolver {
            set: ArcSwap::from_pointee(set),
            acme: None,
        }
    }

    pub(crate) fn with_acme(set: CertSet, acme: AcmeCerts) -> SniResolver {
        SniResolver {
            set: ArcSwap::from_pointee(set),
            acme: Some(acme),
        }
    }

    pub(crate) fn acme(&self) -> Option<&AcmeCerts> {
        self.acme.as_ref()
    }

    /// New handshakes use `set` from now on.
    pub fn replace(&self, set: CertSet) {
        self.set.store(Arc::new(set));
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let sni = hello.server_name();
        if let Some(acme) = &self.acme {
            // A TLS-ALPN-01 validator offers only `acme-tls/1` (RFC 8737 §3): it gets the
            // challenge certificate or no handshake, never a site's certificate.
            if hello
                .alpn()
                .is_some_and(|mut protocols| protocols.any(|p| p == ACME_TLS_ALPN))
            {
                return acme.challenge(sni);
            }
            if let Some(key) = acme.pick(sni) {
                return Some(key);
            }
        }
        Some(self.set.load().pick(sni).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(names: &[&str]) -> LoadedCert {
        let c = rcgen::generate_simple_self_signed(
            names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        crate::certs::from_der(
            vec![c.cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(c.signing_key.serialize_der().into()),
            &provider,
        )
        .unwrap()
    }

    #[test]
    fn exact_then_wildcard_then_default() {
        let default = cert(&["default.test"]);
        let exact = cert(&["www.example.org"]);
        let wild = cert(&["*.example.org"]);
        let set = CertSet::new(vec![default.clone(), exact.clone(), wild.clone()]).unwrap();
        let is = |got: &Arc<CertifiedKey>, want: &LoadedCert| Arc::ptr_eq(got, &want.key);
        assert!(is(set.pick(Some("www.example.org")), &exact));
        assert!(is(set.pick(Some("api.example.org")), &wild));
        // One label only, and not the bare parent.
        assert!(is(set.pick(Some("a.b.example.org")), &default));
        assert!(is(set.pick(Some("example.org")), &default));
        assert!(is(set.pick(Some("unknown.test")), &default));
        assert!(is(set.pick(None), &default));
        assert!(is(set.pick(Some("default.test")), &default));
    }

    #[test]
    fn the_first_certificate_naming_a_host_wins() {
        let a = cert(&["x.test"]);
        let b = cert(&["x.test"]);
        let set = CertSet::new(vec![a.clone(), b]).unwrap();
        assert!(Arc::ptr_eq(set.pick(Some("x.test")), &a.key));
        assert!(CertSet::new(Vec::new()).is_err());
    }
}
