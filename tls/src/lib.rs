//! tern-tls: TLS, the transport under tern's HTTP protocols (layer 1 in ARCHITECTURE.md's map).
//!
//! - [`TlsAcceptor`] holds what every handshake shares: the rustls server config (TLS 1.3 and
//!   1.2 with Mozilla's "intermediate" suites and groups, no 0-RTT), the SNI certificate
//!   resolver (reloadable) and the rotating session-ticket keys (optionally kept on disk).
//! - [`TlsSession`] is one connection's TLS state, driven without I/O by the server's
//!   connection over its own buffers: rustls runs the handshake, then records are sealed and
//!   opened in place (`record.rs`). [`ClientSession`] is a connection to an upstream server
//!   (the reverse proxy as a TLS client), on rustls's buffered connection.
//!
//! Crypto: aws-lc-rs, chosen by measurement (ARCHITECTURE.md, `examples/providers.rs`).

mod acme;
mod certs;
mod record;
mod resolver;
mod self_signed;
mod server_session;
mod session;
mod tickets;
pub mod upstream;

use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::{aws_lc_rs as provider, CryptoProvider};
use rustls::server::NoServerSessionStorage;
use rustls::ServerConfig;

pub use acme::{tls_alpn_sni, AcmeCerts, ACME_TLS_ALPN};
pub use certs::LoadedCert;
pub use record::{MAX_PLAINTEXT, MAX_RECORD};
pub use resolver::{CertSet, SniResolver};
pub use server_session::{Received, TlsSession, MAX_HANDSHAKE_INPUT};
pub use session::{ClientSession, Plaintext, TlsFailure};
pub use tickets::TicketKeys;

/// A certificate chain file and its key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What a TLS listener needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// The first pair is the default certificate; the others are chosen by SNI.
    pub certs: Vec<CertFiles>,
    /// Make a certificate for localhost at start-up (added after `certs`, or the default).
    pub self_signed: bool,
    /// Where session-ticket keys are kept; `None` keeps them in memory.
    pub ticket_keys: Option<PathBuf>,
    /// ALPN protocols, preferred first.
    pub alpn: Vec<Vec<u8>>,
    /// Automatic HTTPS: certificates and TLS-ALPN-01 answers come from the ACME helper
    /// ([`TlsAcceptor::acme`]), and `acme-tls/1` is offered last.
    pub acme: bool,
    /// Accept 0-RTT early data on QUIC (HTTP/3) handshakes that resume a session. Early data
    /// can be replayed by whoever saw it: the server answers only safe requests it can answer
    /// itself from it (HTTP/3's `425 Too Early` for the rest).
    pub quic_early_data: bool,
}

/// Shared by every worker: makes a [`TlsSession`] per accepted connection.
pub struct TlsAcceptor {
    config: Arc<ServerConfig>,
    /// HTTP/3's: TLS 1.3 only, ALPN `h3`, the same certificates (resolver) and ticket keys.
    quic_config: Arc<ServerConfig>,
    resolver: Arc<SniResolver>,
    self_signed: Option<(LoadedCert, String)>,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor").finish_non_exhaustive()
    }
}

/// aws-lc-rs with Mozilla's "intermediate" configuration (v5.7): TLS 1.3 suites, the ECDHE
/// AEAD suites of TLS 1.2 (rustls has no DHE or CBC suites, so nothing weaker can be
/// offered), and the groups X25519, P-256 and P-384, preceded by the post-quantum hybrid
/// X25519MLKEM768 (TLS 1.3 only), so that what is recorded today cannot be decrypted by a
/// quantum computer later. rustls takes the first of the client's groups it also has: a
/// client that prefers the hybrid and sends its key share (current Chrome, Firefox, Safari)
/// gets it; one that does not keeps its classical group.
pub fn crypto_provider() -> CryptoProvider {
    use provider::cipher_suite as cs;
    CryptoProvider {
        cipher_suites: vec![
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS13_AES_256_GCM_SHA384,
            cs::TLS13_CHACHA20_POLY1305_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ],
        kx_groups: vec![
            provider::kx_group::X25519MLKEM768,
            provider::kx_group::X25519,
            provider::kx_group::SECP256R1,
            provider::kx_group::SECP384R1,
        ],
        ..provider::default_provider()
    }
}

impl TlsAcceptor {
    pub fn new(options: &TlsOptions) -> Result<TlsAcceptor, String> {
        let provider = Arc::new(crypto_provider());
        let self_signed = options
            .self_signed
            .then(|| self_signed::make(&provider))
            .transpose()?;
        let set = cert_set(options, self_signed.as_ref(), &provider)?;
        let resolver = Arc::new(match options.acme {
            true => SniResolver::with_acme(set, AcmeCerts::new(provider.clone())),
            false => SniResolver::new(set),
        });
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = options.alpn.clone();
        if options.acme {
            config.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
        }
        config.ticketer = match &options.ticket_keys {
            Some(path) => TicketKeys::with_file(path)?,
            None => TicketKeys::in_memory()?,
        };
        // Stateless tickets only: no session cache shared (and locked) between workers.
        config.session_storage = Arc::new(NoServerSessionStorage {});
        // One ticket per full handshake is what a browser uses; the second that rustls
        // sends by default costs an encryption and a record on every handshake.
        config.send_tls13_tickets = 1;
        config.max_early_data_size = 0;
        // Established sessions seal and open their records themselves (`record.rs`).
        config.enable_secret_extraction = true;
        let quic_config = quic_config(&config, resolver.clone(), options.quic_early_data)?;
        Ok(TlsAcceptor {
            config: Arc::new(config),
            quic_config,
            resolver,
            self_signed,
        })
    }

    /// A fresh server session for an accepted connection.
    pub fn accept(&self) -> TlsSession {
        TlsSession::new(self.config.clone())
    }

    /// The rustls configuration every session starts from (for tests that play a TLS
    /// server with rustls's own connection).
    pub fn config(&self) -> Arc<ServerConfig> {
        self.config.clone()
    }

    /// The rustls configuration of QUIC handshakes (HTTP/3): certificates chosen by the
    /// same resolver, so reloads and ACME apply to both, and tickets sealed by the same keys.
    pub fn quic_config(&self) -> Arc<ServerConfig> {
        self.quic_config.clone()
    }

    /// Re-reads the certificate files; new handshakes use them, open connections keep theirs.
    /// On any error nothing changes.
    pub fn reload(&self, options: &TlsOptions) -> Result<(), String> {
        let provider = self.config.crypto_provider();
        let set = cert_set(options, self.self_signed.as_ref(), provider)?;
        self.resolver.replace(set);
        Ok(())
    }

    /// Where the ACME helper's certificates and challenge answers go (automatic HTTPS only).
    pub fn acme(&self) -> Option<&AcmeCerts> {
        self.resolver.acme()
    }

    /// The SHA-256 fingerprint of the certificate made by `--tls-self-signed`.
    pub fn self_signed_fingerprint(&self) -> Option<&str> {
        self.self_signed.as_ref().map(|(_, f)| f.as_str())
    }
}

/// Sessions kept for 0-RTT: a few hundred bytes each; the oldest go first.
const EARLY_DATA_SESSIONS: usize = 16 * 1024;

/// QUIC runs TLS 1.3 only (RFC 9001 §4.2) and offers `h3` alone. Otherwise the TCP
/// listeners' configuration: the same provider, resolver and ticketer; but with 0-RTT on,
/// sessions are kept in memory instead (rustls accepts early data only then): each ticket is
/// a key into one cache all workers share, taken out when it is used, so a replay of early
/// data to this process finds no session. Such tickets do not survive a restart.
fn quic_config(
    tcp: &ServerConfig,
    resolver: Arc<SniResolver>,
    early_data: bool,
) -> Result<Arc<ServerConfig>, String> {
    let mut config = ServerConfig::builder_with_provider(tcp.crypto_provider().clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS configuration for HTTP/3: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h3".to_vec()];
    if early_data {
        config.session_storage = rustls::server::ServerSessionMemoryCache::new(EARLY_DATA_SESSIONS);
    } else {
        config.ticketer = tcp.ticketer.clone();
        config.session_storage = Arc::new(NoServerSessionStorage {});
    }
    config.send_tls13_tickets = 1;
    // QUIC takes all or nothing here (RFC 9001 §4.6.1: the limit lives in QUIC's flow
    // control, not in TLS).
    config.max_early_data_size = if early_data { u32::MAX } else { 0 };
    Ok(Arc::new(config))
}

fn cert_set(
    options: &TlsOptions,
    self_signed: Option<&(LoadedCert, String)>,
    provider: &CryptoProvider,
) -> Result<CertSet, String> {
    let mut loaded = options
        .certs
        .iter()
        .map(|f| certs::load_pair(&f.cert, &f.key, provider))
        .collect::<Result<Vec<_>, _>>()?;
    loaded.extend(self_signed.map(|(c, _)| c.clone()));
    CertSet::new(loaded).map_err(|_| "no TLS certificate given".into())
}
