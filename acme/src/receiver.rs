//! The server's side of the helper: one thread reads the helper's lines, puts certificates
//! and challenge answers into the TLS layer, acknowledges the answers, and keeps the latest
//! status for `/statusz` and `/metrics`. Workers only ever read snapshots it stored.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};

use tern_tls::TlsAcceptor;

use crate::wire::{self, Status, ToHelper, ToServer};

/// The helper's last status report, and whether it is still running.
#[derive(Debug, Default)]
pub struct AcmeStatus {
    status: Mutex<Status>,
    helper_gone: std::sync::atomic::AtomicBool,
    /// Certificates received from the helper (stored ones at start included).
    installed: std::sync::atomic::AtomicU64,
}

impl AcmeStatus {
    pub fn snapshot(&self) -> Status {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn helper_running(&self) -> bool {
        !self.helper_gone.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn installed(&self) -> u64 {
        self.installed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The server's handle on its helper.
#[derive(Clone)]
pub struct Receiver {
    to_helper: Arc<Mutex<Box<dyn Write + Send>>>,
    pub status: Arc<AcmeStatus>,
}

impl Receiver {
    /// Starts the receiving thread (before the sandbox: it creates a thread). `from` is the
    /// helper's stdout, `to` its stdin; `config_line` is sent first.
    pub fn start(
        from: impl Read + Send + 'static,
        to: impl Write + Send + 'static,
        config_line: &str,
        acceptor: Arc<TlsAcceptor>,
    ) -> Result<Receiver, String> {
        if acceptor.acme().is_none() {
            return Err("the TLS acceptor was made without ACME".into());
        }
        let to_helper: Arc<Mutex<Box<dyn Write + Send>>> = Arc::new(Mutex::new(Box::new(to)));
        let receiver = Receiver {
            to_helper,
            status: Arc::new(AcmeStatus::default()),
        };
        receiver.write_line(config_line);
        let r = receiver.clone();
        std::thread::Builder::new()
            .name("acme-receiver".into())
            .spawn(move || r.receive(BufReader::new(from), &acceptor))
            .map_err(|e| format!("cannot start the ACME receiving thread: {e}"))?;
        Ok(receiver)
    }

    fn write_line(&self, line: &str) {
        let mut to = self.to_helper.lock().unwrap_or_else(|p| p.into_inner());
        // A helper that is gone is noticed (and logged) by the receiving thread.
        let _ = to.write_all(line.as_bytes()).and_then(|()| to.flush());
    }

    /// SIGHUP: the helper looks at every certificate now (ARI included), back-off ignored once.
    pub fn check_now(&self) {
        self.write_line(&wire::encode(&ToHelper::CheckNow));
    }

    fn receive(&self, from: impl BufRead, acceptor: &TlsAcceptor) {
        let acme = acceptor.acme().expect("checked at start");
        for line in from.lines() {
            let Ok(line) = line else { break };
            let message = match wire::decode::<ToServer>(&line) {
                Ok(m) => m,
                Err(e) => {
                    tracing::error!("acme: {e}");
                    continue;
                }
            };
            match message {
                ToServer::Certificate {
                    names,
                    chain_pem,
                    key_pem,
                } => match acme.install(&names, &chain_pem, &key_pem) {
                    Ok(()) => {
                        self.status
                            .installed
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::info!(
                            "acme: now serving a new certificate for {}",
                            names.join(", ")
                        )
                    }
                    Err(e) => {
                        tracing::error!("acme: certificate for {} not used: {e}", names.join(", "))
                    }
                },
                ToServer::TlsAlpn {
                    seq,
                    identifier,
                    cert_and_key,
                } => {
                    let error = acme.set_tls_alpn(&identifier, cert_and_key).err();
                    self.write_line(&wire::encode(&ToHelper::Applied { seq, error }));
                }
                ToServer::Http01 {
                    seq,
                    token,
                    key_authorization,
                } => {
                    acme.set_http01(&token, key_authorization.as_deref());
                    self.write_line(&wire::encode(&ToHelper::Applied { seq, error: None }));
                }
                ToServer::Status(status) => {
                    *self.status.status.lock().unwrap_or_else(|p| p.into_inner()) = status;
                }
            }
        }
        self.status
            .helper_gone
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(
            "acme: the ACME helper stopped; the certificates in use are kept, but nothing is renewed until tern restarts"
        );
    }
}
