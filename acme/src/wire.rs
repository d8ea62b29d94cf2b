//! The helper's messages, one JSON object per line. Helper → server on the helper's stdout;
//! server → helper on its stdin. The server applies every message on one receiving thread and
//! acknowledges challenge answers, so the helper tells the CA "ready" only once the workers
//! can answer.

use serde::{Deserialize, Serialize};

/// Helper → server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToServer {
    /// Serve this chain (PEM, leaf first) and key (PEM) for these names.
    Certificate {
        names: Vec<String>,
        chain_pem: String,
        key_pem: String,
    },
    /// Answer TLS-ALPN-01 for `identifier` with this certificate and key (DER), or stop
    /// (`None`). Acknowledged with `seq`.
    TlsAlpn {
        seq: u64,
        identifier: String,
        cert_and_key: Option<(Vec<u8>, Vec<u8>)>,
    },
    /// Answer HTTP-01 for `token`, or stop (`None`). Acknowledged with `seq`.
    Http01 {
        seq: u64,
        token: String,
        key_authorization: Option<String>,
    },
    /// What `/statusz` and `/metrics` show.
    Status(Status),
}

/// Server → helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToHelper {
    /// The message `seq` was applied (or could not be: `error`).
    Applied { seq: u64, error: Option<String> },
    /// SIGHUP: look at every certificate now (ARI included), ignoring back-off once.
    CheckNow,
}

/// The helper's view of its certificates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Completed looks at every certificate (the first ends after start-up's orders).
    pub checks: u64,
    pub orders_valid: u64,
    pub orders_failed: u64,
    pub certs: Vec<CertStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertStatus {
    pub name: String,
    /// Unix seconds; 0 while no certificate was issued.
    pub not_after: i64,
    /// Unix seconds of the next renewal (or retry after a failure).
    pub next_renewal: i64,
    /// The last failure, until an order succeeds.
    pub last_error: Option<String>,
}

/// One line: the message as JSON and `\n`.
pub fn encode<T: Serialize>(message: &T) -> String {
    let mut line = serde_json::to_string(message).expect("messages always serialize");
    line.push('\n');
    line
}

pub fn decode<'a, T: Deserialize<'a>>(line: &'a str) -> Result<T, String> {
    serde_json::from_str(line.trim_end())
        .map_err(|e| format!("bad message from the ACME helper: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_an_error() {
        let m = ToServer::Http01 {
            seq: 3,
            token: "t".into(),
            key_authorization: Some("t.k".into()),
        };
        let line = encode(&m);
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        assert_eq!(decode::<ToServer>(&line).unwrap(), m);
        assert_eq!(
            decode::<ToHelper>(&encode(&ToHelper::CheckNow)).unwrap(),
            ToHelper::CheckNow
        );
        assert!(decode::<ToServer>("{\"type\":\"nope\"}").is_err());
        assert!(decode::<ToServer>("\u{0}").is_err());
    }
}
