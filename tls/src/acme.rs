//! What automatic HTTPS (ACME) puts into the TLS layer while the server runs: certificates
//! issued for names, TLS-ALPN-01 challenge certificates (RFC 8737) and HTTP-01 key
//! authorizations (RFC 8555 §8.3). The ACME helper sends them; one receiving thread stores
//! them here; handshakes and plain-HTTP requests read them. Every change is a new snapshot
//! behind an `ArcSwap`, so a reader never waits and open connections keep their certificate.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The ALPN protocol of TLS-ALPN-01 validations (RFC 8737 §6.2).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

#[derive(Debug, Default, Clone)]
struct Snapshot {
    /// Issued certificates by name (lowercase DNS name or IP address text).
    certs: HashMap<String, Arc<CertifiedKey>>,
    /// For clients that send no SNI (an `https://127.0.0.1/` URL): the certificate of the
    /// first IP address issued for.
    no_sni: Option<Arc<CertifiedKey>>,
    /// TLS-ALPN-01 certificates by the SNI the validator sends (the name, or for an IP
    /// address its reverse-DNS name).
    alpn: HashMap<String, Arc<CertifiedKey>>,
    /// HTTP-01 key authorizations by token.
    http01: HashMap<String, Arc<str>>,
}

/// The ACME part of the certificate resolver (see [`crate::SniResolver`]).
pub struct AcmeCerts {
    snapshot: ArcSwap<Snapshot>,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for AcmeCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.snapshot.load();
        f.debug_struct("AcmeCerts")
            .field("certs", &s.certs.len())
            .field("alpn", &s.alpn.len())
            .field("http01", &s.http01.len())
            .finish()
    }
}

/// The SNI a TLS-ALPN-01 validator sends for an identifier: the name itself, or for an IP
/// address the reverse-DNS name (RFC 8738 §6: `1.0.0.127.in-addr.arpa`).
pub fn tls_alpn_sni(identifier: &str) -> String {
    match identifier.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa", o[3], o[2], o[1], o[0])
        }
        Ok(IpAddr::V6(v6)) => {
            let mut s = String::with_capacity(72);
            for byte in v6.octets().iter().rev() {
                s.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
                s.push('.');
                s.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
                s.push('.');
            }
            s.push_str("ip6.arpa");
            s
        }
        Err(_) => identifier.to_ascii_lowercase(),
    }
}

impl AcmeCerts {
    pub(crate) fn new(provider: Arc<CryptoProvider>) -> AcmeCerts {
        AcmeCerts {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            provider,
        }
    }

    fn update(&self, change: impl Fn(&mut Snapshot)) {
        // One writer (the receiving thread), so `rcu` never retries in practice.
        self.snapshot.rcu(|old| {
            let mut next = Snapshot::clone(old);
            change(&mut next);
            next
        });
    }

    /// Serves `chain_pem` (leaf first) with `key_pem` for `names` from the next handshake on.
    /// The key must belong to the leaf; on any error nothing changes.
    pub fn install(&self, names: &[String], chain_pem: &str, key_pem: &str) -> Result<(), String> {
        let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("bad certificate PEM: {e:?}"))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| format!("bad key PEM: {e:?}"))?;
        let certified = Arc::new(self.certified(chain, key, true)?);
        self.update(|s| {
            for name in names {
                let name = name.to_ascii_lowercase();
                if name.parse::<IpAddr>().is_ok() && s.no_sni.is_none() {
                    s.no_sni = Some(certified.clone());
                }
                s.certs.insert(name, certified.clone());
            }
        });
        Ok(())
    }

    /// Answers TLS-ALPN-01 handshakes for `identifier` with this certificate (DER), or stops
    /// answering them (`None`).
    pub fn set_tls_alpn(
        &self,
        identifier: &str,
        cert_and_key: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Result<(), String> {
        let sni = tls_alpn_sni(identifier);
        let certified = match cert_and_key {
            Some((cert, key)) => Some(Arc::new(self.certified(
                vec![CertificateDer::from(cert)],
                PrivateKeyDer::try_from(key).map_err(|e| format!("bad challenge key: {e}"))?,
                // The check parses the certificate as webpki does, which refuses the critical
                // acmeIdentifier extension that a challenge certificate must carry.
                false,
            )?)),
            None => None,
        };
        self.update(|s| match &certified {
            Some(c) => {
                s.alpn.insert(sni.clone(), c.clone());
            }
            None => {
                s.alpn.remove(&sni);
            }
        });
        Ok(())
    }

    /// Answers `GET /.well-known/acme-challenge/TOKEN` with `key_authorization`, or stops.
    pub fn set_http01(&self, token: &str, key_authorization: Option<&str>) {
        let value: Option<Arc<str>> = key_authorization.map(Arc::from);
        self.update(|s| match &value {
            Some(v) => {
                s.http01.insert(token.to_string(), v.clone());
            }
            None => {
                s.http01.remove(token);
            }
        });
    }

    /// The key authorization for an HTTP-01 token, if a validation is under way.
    pub fn http01(&self, token: &str) -> Option<Arc<str>> {
        let s = self.snapshot.load();
        if s.http01.is_empty() {
            return None;
        }
        s.http01.get(token).cloned()
    }

    /// The certificate for a handshake: `None` when ACME has nothing for it (the resolver
    /// then uses its own set).
    pub(crate) fn pick(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let s = self.snapshot.load();
        match sni {
            Some(name) => s.certs.get(name).cloned(),
            None => s.no_sni.clone(),
        }
    }

    /// The TLS-ALPN-01 certificate for a validator's handshake.
    pub(crate) fn challenge(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        self.snapshot.load().alpn.get(sni?).cloned()
    }

    fn certified(
        &self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        check_pair: bool,
    ) -> Result<CertifiedKey, String> {
        if chain.is_empty() {
            return Err("no certificate".into());
        }
        let signing = self
            .provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| format!("unusable private key: {e}"))?;
        let certified = CertifiedKey::new(chain, signing);
        if check_pair {
            certified
                .keys_match()
                .map_err(|e| format!("the key does not belong to the certificate: {e}"))?;
        }
        Ok(certified)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acme() -> AcmeCerts {
        AcmeCerts::new(Arc::new(crate::crypto_provider()))
    }

    #[test]
    fn reverse_names_for_ip_validations() {
        assert_eq!(tls_alpn_sni("127.0.0.1"), "1.0.0.127.in-addr.arpa");
        assert_eq!(tls_alpn_sni("Example.ORG"), "example.org");
        let v6 = tls_alpn_sni("2001:db8::1");
        assert!(v6.starts_with("1.0.0.0.0.0.0.0."), "{v6}");
        assert!(v6.ends_with("8.b.d.0.1.0.0.2.ip6.arpa"), "{v6}");
    }

    #[test]
    fn installed_certificates_are_picked_by_name_and_ip_certificates_without_sni() {
        let a = acme();
        assert!(a.pick(Some("a.test")).is_none());
        assert!(a.pick(None).is_none());
        let made = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        let names = vec!["A.test".to_string(), "127.0.0.1".to_string()];
        a.install(&names, &made.cert.pem(), &made.signing_key.serialize_pem())
            .unwrap();
        let got = a.pick(Some("a.test")).unwrap();
        assert_eq!(got.cert[0].as_ref(), made.cert.der().as_ref());
        assert!(Arc::ptr_eq(&got, &a.pick(None).unwrap()));
        // A key of another certificate changes nothing.
        let other = rcgen::generate_simple_self_signed(vec!["b.test".into()]).unwrap();
        let e = a
            .install(
                &["b.test".into()],
                &made.cert.pem(),
                &other.signing_key.serialize_pem(),
            )
            .unwrap_err();
        assert!(e.contains("does not belong"), "{e}");
        assert!(a.pick(Some("b.test")).is_none());
        assert!(a.install(&names, "garbage", "garbage").is_err());
    }

    #[test]
    fn challenges_come_and_go() {
        let a = acme();
        assert_eq!(a.http01("t"), None);
        a.set_http01("t", Some("t.thumb"));
        assert_eq!(a.http01("t").as_deref(), Some("t.thumb"));
        assert_eq!(a.http01("u"), None);
        a.set_http01("t", None);
        assert_eq!(a.http01("t"), None);
        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
        let pair = (
            made.cert.der().to_vec(),
            made.signing_key.serialize_der().to_vec(),
        );
        a.set_tls_alpn("127.0.0.1", Some(pair)).unwrap();
        assert!(a.challenge(Some("1.0.0.127.in-addr.arpa")).is_some());
        assert!(a.challenge(Some("127.0.0.1")).is_none());
        assert!(a.challenge(None).is_none());
        a.set_tls_alpn("127.0.0.1", None).unwrap();
        assert!(a.challenge(Some("1.0.0.127.in-addr.arpa")).is_none());
    }
}

/// A TLS-ALPN-01 validation handshake against the resolver, as a CA makes it.
#[cfg(test)]
mod handshake_tests {
    use std::sync::{Arc, Mutex};

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    use crate::{TlsAcceptor, TlsOptions, ACME_TLS_ALPN};

    /// Accepts any certificate and keeps it (a validator looks at it itself).
    #[derive(Debug, Default)]
    struct Keep(Mutex<Option<CertificateDer<'static>>>);

    impl ServerCertVerifier for Keep {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            *self.0.lock().unwrap() = Some(end_entity.clone().into_owned());
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            rustls::crypto::aws_lc_rs::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }

    /// Runs a handshake for `sni` offering `alpn`; the certificate the server showed, if the
    /// handshake completed, and the protocol agreed on.
    fn handshake(
        acceptor: &TlsAcceptor,
        sni: &str,
        alpn: &[u8],
    ) -> Option<(CertificateDer<'static>, Option<Vec<u8>>)> {
        let keep = Arc::new(Keep::default());
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(keep.clone())
        .with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        let name = ServerName::try_from(sni.to_string()).unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut server = acceptor.accept();
        for _ in 0..10 {
            let mut to_server = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut to_server).unwrap();
            }
            if let crate::Received::More { taken, .. } = server.receive(&mut to_server).ok()? {
                assert_eq!(
                    taken,
                    to_server.len(),
                    "the handshake takes all it is given"
                );
            }
            let mut to_client = vec![0u8; 1 << 16];
            let n = server.take_control(&mut to_client);
            let mut rest = &to_client[..n];
            while !rest.is_empty() {
                client.read_tls(&mut rest).unwrap();
                client.process_new_packets().ok()?;
            }
        }
        if client.is_handshaking() {
            return None;
        }
        let cert = keep.0.lock().unwrap().clone()?;
        Some((cert, client.alpn_protocol().map(<[u8]>::to_vec)))
    }

    #[test]
    fn a_validator_gets_the_challenge_certificate_and_others_the_site_certificate() {
        let acceptor = TlsAcceptor::new(&TlsOptions {
            self_signed: true,
            acme: true,
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            ..Default::default()
        })
        .unwrap();
        let acme = acceptor.acme().unwrap();
        // No challenge under way: no handshake at all for a validator.
        assert!(handshake(&acceptor, "a.test", ACME_TLS_ALPN).is_none());
        let challenge = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["a.test".to_string()]).unwrap();
        params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(&[1; 32])];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        acme.set_tls_alpn("a.test", Some((cert.der().to_vec(), key.serialize_der())))
            .unwrap();
        acme.set_tls_alpn(
            "127.0.0.1",
            Some((
                challenge.cert.der().to_vec(),
                challenge.signing_key.serialize_der(),
            )),
        )
        .unwrap();
        let (got, alpn) = handshake(&acceptor, "a.test", ACME_TLS_ALPN).unwrap();
        assert_eq!(got.as_ref(), cert.der().as_ref());
        assert_eq!(alpn.as_deref(), Some(ACME_TLS_ALPN));
        let (got, _) = handshake(&acceptor, "1.0.0.127.in-addr.arpa", ACME_TLS_ALPN).unwrap();
        assert_eq!(got.as_ref(), challenge.cert.der().as_ref());
        // A browser for the same name gets the site's (here the self-signed) certificate.
        let (got, alpn) = handshake(&acceptor, "a.test", b"h2").unwrap();
        assert_ne!(got.as_ref(), cert.der().as_ref());
        assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    }
}
