//! What the helper is told at start: the CA, the account, the names and the challenges.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Let's Encrypt's production directory, the default CA.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

/// The challenge types tern can answer itself (DNS-01 needs a DNS provider's API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChallengeKind {
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
    #[serde(rename = "http-01")]
    Http01,
}

impl ChallengeKind {
    pub fn parse(s: &str) -> Result<ChallengeKind, String> {
        match s {
            "tls-alpn-01" => Ok(ChallengeKind::TlsAlpn01),
            "http-01" => Ok(ChallengeKind::Http01),
            other => Err(format!(
                "unknown ACME challenge {other:?} (tern answers tls-alpn-01 and http-01)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ChallengeKind::TlsAlpn01 => "tls-alpn-01",
            ChallengeKind::Http01 => "http-01",
        }
    }
}

/// Everything the helper needs; sent to it as the first line of its stdin (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcmeConfig {
    /// The CA's directory URL.
    pub directory: String,
    /// Contact address for the account (`mailto:` is added).
    pub email: Option<String>,
    /// The persistent folder for the account, certificates, keys and locks.
    pub state: PathBuf,
    /// One certificate per name: DNS names (lowercase, no wildcard) or IP addresses.
    pub names: Vec<String>,
    /// The CA profile to ask for (`classic`, `tlsserver`, `shortlived`); IP addresses always
    /// ask for `shortlived` when the CA offers it.
    pub profile: Option<String>,
    /// External account binding (key id, base64url HMAC key) for CAs that need one.
    pub eab: Option<(String, String)>,
    /// Tried in this order; after a failure the next one is used.
    pub challenges: Vec<ChallengeKind>,
    /// A root (PEM) to trust for the directory's own HTTPS (a private CA, Pebble).
    pub ca_root: Option<PathBuf>,
}

impl AcmeConfig {
    /// Checks what can be checked before anything starts; errors are one line.
    pub fn validate(&self) -> Result<(), String> {
        if self.names.is_empty() {
            return Err("ACME needs at least one name".into());
        }
        for name in &self.names {
            check_name(name)?;
        }
        if self.challenges.is_empty() {
            return Err("ACME needs a challenge type (tls-alpn-01 or http-01)".into());
        }
        if !self.directory.starts_with("https://") {
            return Err(format!(
                "ACME directory {:?} is not an https:// URL",
                self.directory
            ));
        }
        if self.state.as_os_str().is_empty() {
            return Err("ACME needs a persistent state folder".into());
        }
        Ok(())
    }
}

/// A name ACME can issue for without DNS-01: an exact DNS name or an IP address.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    if name.starts_with("*.") {
        return Err(format!(
            "{name}: a wildcard certificate needs the DNS-01 challenge, which tern does not answer; list the names instead"
        ));
    }
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    if !valid {
        return Err(format!(
            "{name:?} is not a host name ACME can issue for (lowercase letters, digits, '-' and '.')"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_exact_hosts_or_addresses() {
        assert!(check_name("www.example.org").is_ok());
        assert!(check_name("127.0.0.1").is_ok());
        assert!(check_name("::1").is_ok());
        let e = check_name("*.example.org").unwrap_err();
        assert!(e.contains("DNS-01"), "{e}");
        assert!(check_name("Example.org").is_err());
        assert!(check_name("a..b").is_err());
        assert!(check_name("-a.b").is_err());
        assert!(check_name("").is_err());
        assert_eq!(
            ChallengeKind::parse("http-01").unwrap(),
            ChallengeKind::Http01
        );
        assert!(ChallengeKind::parse("dns-01").is_err());
    }
}
