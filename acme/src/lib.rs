//! tern-acme: automatic HTTPS (ACME, RFC 8555) the way Caddy does it, in a helper process.
//!
//! - [`helper`]: `tern acme-helper`, started before the sandbox. It alone talks to the CA
//!   (instant-acme on a current-thread tokio runtime), keeps the [`state`] folder, and decides
//!   when to renew ([`schedule`]: ARI, RFC 9773, with a fallback at 1/3 of the lifetime).
//! - [`wire`]: what it tells the server over its stdout (certificates, challenge answers,
//!   status) and what the server tells it over its stdin (acknowledgements, "check now").
//! - [`receiver`]: the server side: one thread that applies the helper's messages to the TLS
//!   layer's [`tern_tls::AcmeCerts`] and keeps the status for `/statusz` and `/metrics`.
//!
//! The workers never talk to the CA and never wait for it: until a certificate is issued a
//! name is served with the stored one or the self-signed one.

pub mod config;
pub mod helper;
pub mod receiver;
pub mod schedule;
pub mod state;
pub mod wire;

pub use config::{AcmeConfig, ChallengeKind, LETS_ENCRYPT};
pub use receiver::{AcmeStatus, Receiver};
