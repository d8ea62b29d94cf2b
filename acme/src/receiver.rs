//! The server's side of the helper: one thread reads the helper's lines, puts certificates
//! and challenge answers into the TLS layer, acknowledges the answers, and keeps the latest
//! status for `/statusz` and `/metrics`. Workers only ever read snapshots it stored.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
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
    /// Sends the helper its settings (`config_line`) and returns the handle and the loop
    /// that receives the helper's lines (`from`, its stdout; `to` is its stdin). The loop
    /// runs on a thread of the caller's (a server's background thread).
    pub fn new(
        from: OwnedFd,
        to: impl Write + Send + 'static,
        config_line: &str,
        acceptor: Arc<TlsAcceptor>,
    ) -> Result<(Receiver, ReceiveLoop), String> {
        if acceptor.acme().is_none() {
            return Err("the TLS acceptor was made without ACME".into());
        }
        let to_helper: Arc<Mutex<Box<dyn Write + Send>>> = Arc::new(Mutex::new(Box::new(to)));
        let receiver = Receiver {
            to_helper,
            status: Arc::new(AcmeStatus::default()),
        };
        receiver.write_line(config_line);
        let receive = ReceiveLoop {
            receiver: receiver.clone(),
            from: File::from(from),
            acceptor,
        };
        Ok((receiver, receive))
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

    fn apply(&self, line: &str, acme: &tern_tls::AcmeCerts) {
        let message = match wire::decode::<ToServer>(line) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!("acme: {e}");
                return;
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
}

/// The longest line the helper may send (a certificate chain is a few KiB).
const MAX_LINE: usize = 1 << 20;

/// Reads the helper's lines and applies them; see [`ReceiveLoop::run`].
pub struct ReceiveLoop {
    receiver: Receiver,
    from: File,
    acceptor: Arc<TlsAcceptor>,
}

impl ReceiveLoop {
    /// Runs until the helper closes its stdout or `stopped()` says so (checked at least every
    /// 200 ms: the server joins this thread when it stops).
    pub fn run(mut self, stopped: impl Fn() -> bool) {
        let acme = self.acceptor.acme().expect("checked in Receiver::new");
        let mut pending: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let receiver = self.receiver.clone();
        loop {
            if stopped() {
                return;
            }
            match wait_readable(&self.from, 200) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => {
                    tracing::error!("acme: waiting for the helper: {e}");
                    break;
                }
            }
            let n = match self.from.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("acme: reading from the helper: {e}");
                    break;
                }
            };
            pending.extend_from_slice(&chunk[..n]);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                match std::str::from_utf8(&line) {
                    Ok(text) => receiver.apply(text, acme),
                    Err(_) => tracing::error!("acme: a line from the helper is not UTF-8"),
                }
            }
            if pending.len() > MAX_LINE {
                tracing::error!("acme: the helper sent a line over {MAX_LINE} bytes; dropped");
                pending.clear();
            }
        }
        receiver
            .status
            .helper_gone
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(
            "acme: the ACME helper stopped; the certificates in use are kept, but nothing is renewed until tern restarts"
        );
    }
}

/// Waits up to `ms` for `file` to be readable (or closed).
fn wait_readable(file: &File, ms: i64) -> std::io::Result<bool> {
    let mut fds = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = libc::timespec {
        tv_sec: ms / 1000,
        tv_nsec: (ms % 1000) * 1_000_000,
    };
    // SAFETY: one pollfd that lives on this stack frame for the call, a valid timespec, no
    // signal mask; ppoll writes only `revents`. (ppoll, not poll: the sandbox allows ppoll.)
    let rc = unsafe { libc::ppoll(&mut fds, 1, &timeout, std::ptr::null()) };
    match rc {
        0 => Ok(false),
        rc if rc > 0 => Ok(true),
        _ => {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => Ok(false),
                _ => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::CertStatus;
    use std::io::BufRead;
    use std::os::unix::net::UnixStream;

    fn acceptor() -> Arc<TlsAcceptor> {
        Arc::new(
            TlsAcceptor::new(&tern_tls::TlsOptions {
                self_signed: true,
                acme: true,
                ..Default::default()
            })
            .unwrap(),
        )
    }

    #[test]
    fn lines_are_applied_acknowledged_and_the_loop_ends_with_the_helper_or_the_stop() {
        let (helper_out, server_in) = UnixStream::pair().unwrap();
        let (server_out, helper_in) = UnixStream::pair().unwrap();
        let acceptor = acceptor();
        let (receiver, receive) = Receiver::new(
            OwnedFd::from(server_in),
            server_out,
            "{}\n",
            acceptor.clone(),
        )
        .unwrap();
        let thread = std::thread::spawn(move || receive.run(|| false));
        let mut from_server = std::io::BufReader::new(helper_in);
        let mut line = String::new();
        from_server.read_line(&mut line).unwrap();
        assert_eq!(line, "{}\n");
        let mut to_server = helper_out;
        let made = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        let messages = [
            ToServer::Http01 {
                seq: 1,
                token: "tok".into(),
                key_authorization: Some("tok.thumb".into()),
            },
            ToServer::Certificate {
                names: vec!["a.test".into()],
                chain_pem: made.cert.pem(),
                key_pem: made.signing_key.serialize_pem(),
            },
            ToServer::Status(Status {
                checks: 1,
                orders_valid: 1,
                orders_failed: 0,
                certs: vec![CertStatus {
                    name: "a.test".into(),
                    not_after: 5,
                    next_renewal: 4,
                    last_error: None,
                }],
            }),
        ];
        // All in one write, the last line split across two: lines are cut where they end.
        let mut bytes = String::new();
        for m in &messages {
            bytes.push_str(&wire::encode(m));
        }
        bytes.insert_str(0, "garbage\n");
        let (a, b) = bytes.split_at(bytes.len() - 10);
        to_server.write_all(a.as_bytes()).unwrap();
        line.clear();
        from_server.read_line(&mut line).unwrap();
        assert_eq!(
            wire::decode::<ToHelper>(&line).unwrap(),
            ToHelper::Applied {
                seq: 1,
                error: None
            }
        );
        assert_eq!(
            acceptor.acme().unwrap().http01("tok").as_deref(),
            Some("tok.thumb")
        );
        to_server.write_all(b.as_bytes()).unwrap();
        receiver.check_now();
        line.clear();
        from_server.read_line(&mut line).unwrap();
        assert_eq!(wire::decode::<ToHelper>(&line).unwrap(), ToHelper::CheckNow);
        // The helper goes away: the loop ends, after applying everything it sent.
        drop(to_server);
        thread.join().unwrap();
        assert!(!receiver.status.helper_running());
        assert_eq!(receiver.status.installed(), 1);
        assert_eq!(receiver.status.snapshot().orders_valid, 1);

        // A stop ends a loop whose helper is still there.
        let (_keep, server_in) = UnixStream::pair().unwrap();
        let (server_out, _helper_in) = UnixStream::pair().unwrap();
        let (_, receive) =
            Receiver::new(OwnedFd::from(server_in), server_out, "{}\n", acceptor).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            receive.run(move || s.load(std::sync::atomic::Ordering::Relaxed))
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        thread.join().unwrap();
    }
}
