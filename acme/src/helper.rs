//! `tern acme-helper`: the only part of tern that talks to the CA.
//!
//! Started by the server before its sandbox, it reads its [`AcmeConfig`] from the first line
//! of stdin, serves what the state folder holds at once, then orders, renews and polls ARI on
//! its own schedule. Network calls run on a current-thread tokio runtime (instant-acme's HTTP
//! client is hyper on tokio); everything else is plain blocking code on one thread, plus one
//! thread that reads the server's lines. When the server goes away (stdin closes) it exits.

use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, CertificateIdentifier, ChallengeType,
    ExternalAccountKey, Identifier, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::config::{AcmeConfig, ChallengeKind};
use crate::schedule::{self, Validity};
use crate::state::{Meta, Store};
use crate::wire::{self, CertStatus, Status, ToHelper, ToServer};

/// How long the server may take to apply a challenge answer.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one order may wait for validation and for the certificate.
const ORDER_TIMEOUT: Duration = Duration::from_secs(90);
/// Another node holds a name's lock: look again after this long.
const LOCKED_RETRY_SECS: i64 = 30;
/// ARI's Retry-After is taken within these bounds.
const ARI_POLL_MIN_SECS: i64 = 60;
const ARI_POLL_MAX_SECS: i64 = 24 * 3600;
/// The longest sleep between looks at the certificates (a clock jump or a suspended
/// machine is noticed within this).
const MAX_SLEEP_SECS: i64 = 600;

enum Event {
    Applied(u64, Option<String>),
    CheckNow,
    Closed,
}

/// One managed name.
struct Managed {
    name: String,
    /// The certificate being served, from the store or a new order.
    current: Option<Current>,
    meta: Meta,
}

struct Current {
    pem: String,
    validity: Validity,
    leaf: CertificateDer<'static>,
}

impl Managed {
    fn renewal_due_at(&self) -> i64 {
        match &self.current {
            Some(c) => schedule::renew_at(c.validity, self.meta.ari_selected),
            None => 0,
        }
        .max(self.meta.next_attempt)
    }
}

struct Helper<W: Write> {
    config: AcmeConfig,
    store: Store,
    rt: tokio::runtime::Runtime,
    out: W,
    events: mpsc::Receiver<Event>,
    seq: u64,
    account: Option<Account>,
    /// `false` once the CA said it has no ARI.
    ari: bool,
    names: Vec<Managed>,
    orders_valid: u64,
    orders_failed: u64,
    checks: u64,
    check_now: bool,
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Reads the helper's settings: the first line of its stdin.
pub fn read_config(input: &mut impl BufRead) -> Result<AcmeConfig, String> {
    let mut first = String::new();
    input
        .read_line(&mut first)
        .map_err(|e| format!("cannot read the config: {e}"))?;
    let config: AcmeConfig = wire::decode(&first)?;
    config.validate()?;
    Ok(config)
}

/// Runs the helper until the server closes its stdin. `input` is the rest of the helper's
/// stdin (after [`read_config`]), `out` its stdout.
pub fn run(
    config: AcmeConfig,
    input: impl BufRead + Send + 'static,
    out: impl Write,
) -> Result<(), String> {
    // The HTTP client asks rustls for the process's provider; with more than one crypto
    // feature compiled into rustls (a workspace build with tests) there is none by default.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let store = Store::open(&config.state, &config.directory)?;
    let (tx, events) = mpsc::channel();
    std::thread::Builder::new()
        .name("acme-stdin".into())
        .spawn(move || read_server(input, tx))
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let names = config
        .names
        .iter()
        .map(|name| Managed {
            name: name.clone(),
            current: None,
            meta: Meta::default(),
        })
        .collect();
    let mut helper = Helper {
        config,
        store,
        rt,
        out,
        events,
        seq: 0,
        account: None,
        ari: true,
        names,
        orders_valid: 0,
        orders_failed: 0,
        checks: 0,
        check_now: false,
    };
    helper.serve_stored()?;
    helper.run_loop()
}

fn read_server(input: impl BufRead, tx: mpsc::Sender<Event>) {
    for line in input.lines() {
        let Ok(line) = line else { break };
        let event = match wire::decode::<ToHelper>(&line) {
            Ok(ToHelper::Applied { seq, error }) => Event::Applied(seq, error),
            Ok(ToHelper::CheckNow) => Event::CheckNow,
            Err(e) => {
                tracing::warn!("acme helper: {e}");
                continue;
            }
        };
        if tx.send(event).is_err() {
            return;
        }
    }
    let _ = tx.send(Event::Closed);
}

/// The server is gone: nothing left to do.
struct Closed;

impl<W: Write> Helper<W> {
    fn send(&mut self, message: &ToServer) -> Result<(), Closed> {
        let line = wire::encode(message);
        self.out
            .write_all(line.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|_| Closed)
    }

    fn send_status(&mut self) -> Result<(), Closed> {
        let status = Status {
            checks: self.checks,
            orders_valid: self.orders_valid,
            orders_failed: self.orders_failed,
            certs: self
                .names
                .iter()
                .map(|m| CertStatus {
                    name: m.name.clone(),
                    not_after: m.current.as_ref().map_or(0, |c| c.validity.not_after),
                    next_renewal: m.renewal_due_at(),
                    last_error: m.meta.last_error.clone(),
                })
                .collect(),
        };
        self.send(&ToServer::Status(status))
    }

    /// Sends a challenge answer and waits until the server applied it.
    fn send_and_wait(&mut self, make: impl FnOnce(u64) -> ToServer) -> Result<(), OrderError> {
        self.seq += 1;
        let seq = self.seq;
        self.send(&make(seq)).map_err(|_| OrderError::Closed)?;
        let deadline = std::time::Instant::now() + ACK_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Applied(s, error)) if s == seq => {
                    return match error {
                        None => Ok(()),
                        Some(e) => Err(OrderError::Failed(format!(
                            "the server could not use the answer: {e}"
                        ))),
                    }
                }
                Ok(Event::Applied(..)) => {}
                Ok(Event::CheckNow) => self.check_now = true,
                Ok(Event::Closed) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(OrderError::Closed)
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(OrderError::Failed(
                        "the server did not apply a challenge answer in time".into(),
                    ))
                }
            }
        }
    }

    /// Serves what the state folder holds, before any network call.
    fn serve_stored(&mut self) -> Result<(), String> {
        for i in 0..self.names.len() {
            let name = self.names[i].name.clone();
            let Some(stored) = self.store.load(&name) else {
                continue;
            };
            match parse_current(&stored.pem) {
                Ok(current) => {
                    let (chain, key) = (stored.chain_pem(), stored.key_pem());
                    self.names[i].current = Some(current);
                    self.names[i].meta = stored.meta;
                    self.send(&ToServer::Certificate {
                        names: vec![name.clone()],
                        chain_pem: chain,
                        key_pem: key,
                    })
                    .map_err(|_| "the server is gone".to_string())?;
                    tracing::info!("acme: {name}: serving the stored certificate");
                }
                Err(e) => tracing::warn!(
                    "acme: {name}: stored certificate unusable ({e}); ordering a new one"
                ),
            }
        }
        self.send_status()
            .map_err(|_| "the server is gone".to_string())
    }

    fn run_loop(&mut self) -> Result<(), String> {
        loop {
            let force = std::mem::take(&mut self.check_now);
            for i in 0..self.names.len() {
                if force {
                    self.names[i].meta.next_attempt = 0;
                    self.names[i].meta.ari_next_poll = 0;
                }
                if self.poll_ari(i).is_err() || self.maybe_order(i).is_err() {
                    return Ok(());
                }
            }
            self.checks += 1;
            if self.send_status().is_err() {
                return Ok(());
            }
            let t = now();
            let mut wake = t + MAX_SLEEP_SECS;
            for m in &self.names {
                wake = wake.min(m.renewal_due_at());
                if m.current.is_some() && self.ari {
                    wake = wake.min(m.meta.ari_next_poll);
                }
            }
            let sleep = Duration::from_secs((wake - t).max(1) as u64);
            match self.events.recv_timeout(sleep) {
                Ok(Event::CheckNow) => self.check_now = true,
                Ok(Event::Applied(..)) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Ok(Event::Closed) | Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            }
        }
    }

    fn account(&mut self) -> Result<Account, String> {
        if let Some(a) = &self.account {
            return Ok(a.clone());
        }
        let builder = match &self.config.ca_root {
            Some(root) => Account::builder_with_root(root),
            None => Account::builder(),
        }
        .map_err(|e| format!("HTTP client: {e}"))?;
        let account = match self.store.load_account() {
            Some(json) => {
                let credentials: AccountCredentials = serde_json::from_str(&json)
                    .map_err(|e| format!("{}/account.json: {e}", self.store.dir().display()))?;
                self.rt
                    .block_on(builder.from_credentials(credentials))
                    .map_err(|e| format!("CA directory {}: {e}", self.config.directory))?
            }
            None => {
                let contact = self.config.email.as_ref().map(|e| format!("mailto:{e}"));
                let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
                let eab = match &self.config.eab {
                    Some((kid, hmac)) => Some(ExternalAccountKey::new(
                        kid.clone(),
                        &base64_url_decode(hmac).ok_or("the EAB hmac is not base64url")?,
                    )),
                    None => None,
                };
                let (account, credentials) = self
                    .rt
                    .block_on(builder.create(
                        &NewAccount {
                            contact: &contacts,
                            terms_of_service_agreed: true,
                            only_return_existing: false,
                        },
                        self.config.directory.clone(),
                        eab.as_ref(),
                    ))
                    .map_err(|e| format!("new account at {}: {e}", self.config.directory))?;
                let json = serde_json::to_string(&credentials)
                    .map_err(|e| format!("account credentials: {e}"))?;
                // Unsaved (a full disk), the account still serves this run; the next start
                // makes another.
                if let Err(e) = self.store.save_account(&json) {
                    tracing::error!("acme: {e}");
                }
                tracing::info!("acme: account {} created", account.id());
                account
            }
        };
        self.account = Some(account.clone());
        Ok(account)
    }

    /// Asks the CA for the renewal window of `names[i]`'s certificate when it is time to.
    fn poll_ari(&mut self, i: usize) -> Result<(), Closed> {
        let t = now();
        let m = &self.names[i];
        let Some(current) = &m.current else {
            return Ok(());
        };
        if !self.ari || t < m.meta.ari_next_poll {
            return Ok(());
        }
        let leaf = current.leaf.clone();
        let name = m.name.clone();
        let account = match self.account() {
            Ok(a) => a,
            Err(e) => {
                // Retried with the next order attempt or ARI poll.
                tracing::debug!("acme: {name}: ARI: {e}");
                self.names[i].meta.ari_next_poll = t + ARI_POLL_MIN_SECS;
                return Ok(());
            }
        };
        let id = match CertificateIdentifier::try_from(&leaf) {
            Ok(id) => id,
            Err(e) => {
                tracing::debug!("acme: {name}: no ARI for this certificate: {e}");
                self.names[i].meta.ari_next_poll = i64::MAX;
                return Ok(());
            }
        };
        let answer = self.rt.block_on(account.renewal_info(&id));
        let meta = &mut self.names[i].meta;
        match answer {
            Ok((info, retry)) => {
                let window = (
                    info.suggested_window.start.unix_timestamp(),
                    info.suggested_window.end.unix_timestamp(),
                );
                if meta.ari_window != Some(window) {
                    let selected = schedule::pick_in_window(window.0, window.1, t, random_u64());
                    if meta.ari_window.is_some() {
                        tracing::warn!(
                            "acme: {name}: the CA moved the renewal window to {}..{}{}",
                            window.0,
                            window.1,
                            info.explanation_url
                                .map(|u| format!(" ({u})"))
                                .unwrap_or_default()
                        );
                    }
                    meta.ari_window = Some(window);
                    meta.ari_selected = Some(selected);
                }
                let retry = (retry.as_secs() as i64).clamp(ARI_POLL_MIN_SECS, ARI_POLL_MAX_SECS);
                meta.ari_next_poll = t + retry;
            }
            Err(instant_acme::Error::Unsupported(_)) => {
                tracing::info!("acme: the CA offers no renewal information (ARI): renewing at 1/3 of the lifetime left");
                self.ari = false;
            }
            Err(e) => {
                tracing::warn!("acme: {name}: renewal information: {e}");
                meta.ari_next_poll = t + 3600;
            }
        }
        let meta = self.names[i].meta.clone();
        if let Err(e) = self.store.save_meta(&name, &meta) {
            tracing::warn!("acme: {name}: {e}");
        }
        Ok(())
    }

    /// Orders a certificate for `names[i]` if it has none or its renewal is due.
    fn maybe_order(&mut self, i: usize) -> Result<(), Closed> {
        let t = now();
        if self.names[i].renewal_due_at() > t {
            return Ok(());
        }
        let name = self.names[i].name.clone();
        let lock = match self.store.try_lock(&name) {
            Ok(Some(lock)) => lock,
            Ok(None) => {
                tracing::info!(
                    "acme: {name}: another node is ordering; waiting for its certificate"
                );
                self.names[i].meta.next_attempt = t + LOCKED_RETRY_SECS;
                return Ok(());
            }
            Err(e) => {
                tracing::warn!("acme: {name}: {e}");
                self.names[i].meta.next_attempt = t + LOCKED_RETRY_SECS;
                return Ok(());
            }
        };
        // Another node sharing the folder may have renewed while this one waited.
        if let Some(stored) = self.store.load(&name) {
            let newer = self.names[i]
                .current
                .as_ref()
                .is_none_or(|c| c.pem != stored.pem);
            if newer {
                if let Ok(current) = parse_current(&stored.pem) {
                    if schedule::renew_at(current.validity, stored.meta.ari_selected) > t {
                        self.names[i].current = Some(current);
                        self.names[i].meta = stored.meta.clone();
                        tracing::info!("acme: {name}: took the certificate another node stored");
                        return self.send(&ToServer::Certificate {
                            names: vec![name],
                            chain_pem: stored.chain_pem(),
                            key_pem: stored.key_pem(),
                        });
                    }
                }
            }
        }
        let renewing = self.names[i].current.is_some();
        let result = self.order(i);
        drop(lock);
        let m = &mut self.names[i];
        match result {
            Ok((chain_pem, key_pem)) => {
                self.orders_valid += 1;
                let meta = Meta::default();
                let pem = format!("{}\n{}", chain_pem.trim_end(), key_pem);
                let current = match parse_current(&pem) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!("acme: {name}: the CA's certificate is unusable: {e}");
                        m.meta.failures += 1;
                        m.meta.next_attempt = t + schedule::backoff(m.meta.failures, None);
                        return Ok(());
                    }
                };
                let not_after = current.validity.not_after;
                m.current = Some(current);
                m.meta = meta;
                if let Err(e) =
                    self.store
                        .save_cert(&name, &chain_pem, &key_pem, &self.names[i].meta)
                {
                    // Served anyway; the next start orders again.
                    tracing::error!("acme: {name}: {e}");
                }
                tracing::info!(
                    "acme: {name}: certificate {} (valid until {}, renewal at {})",
                    if renewing { "renewed" } else { "issued" },
                    not_after,
                    self.names[i].renewal_due_at()
                );
                self.send(&ToServer::Certificate {
                    names: vec![name],
                    chain_pem,
                    key_pem,
                })
            }
            Err(OrderError::Closed) => Err(Closed),
            Err(OrderError::Failed(e)) => {
                self.orders_failed += 1;
                m.meta.failures += 1;
                let left = m.current.as_ref().map(|c| c.validity.not_after - t);
                let wait = schedule::backoff(m.meta.failures, left);
                m.meta.next_attempt = t + wait;
                m.meta.last_error = Some(e.clone());
                tracing::warn!(
                    "acme: {name}: order failed ({} in a row), next try in {wait} s: {e}",
                    m.meta.failures
                );
                let meta = m.meta.clone();
                if let Err(e) = self.store.save_meta(&name, &meta) {
                    tracing::warn!("acme: {name}: {e}");
                }
                Ok(())
            }
        }
    }

    /// One order for `names[i]`: returns the chain and the new key (PEM).
    fn order(&mut self, i: usize) -> Result<(String, String), OrderError> {
        let account = self.account().map_err(OrderError::Failed)?;
        let m = &self.names[i];
        let name = m.name.clone();
        let identifier = match name.parse() {
            Ok(ip) => Identifier::Ip(ip),
            Err(_) => Identifier::Dns(name.clone()),
        };
        let is_ip = matches!(identifier, Identifier::Ip(_));
        // IP certificates must be short-lived at Let's Encrypt.
        let profile = if is_ip && account.profiles().any(|p| p.name == "shortlived") {
            Some("shortlived".to_string())
        } else {
            self.config.profile.clone()
        };
        let replaces = match (&m.current, m.meta.ari_window.is_some()) {
            (Some(c), true) => CertificateIdentifier::try_from(&c.leaf)
                .ok()
                .map(CertificateIdentifier::into_owned),
            _ => None,
        };
        let challenge =
            self.config.challenges[m.meta.failures as usize % self.config.challenges.len()];
        let identifiers = [identifier];
        let new_order = || {
            let order = NewOrder::new(&identifiers);
            match &profile {
                Some(p) => order.profile(p),
                None => order,
            }
        };
        let order = match replaces {
            Some(id) => match self
                .rt
                .block_on(account.new_order(&new_order().replaces(id.clone())))
            {
                Ok(order) => {
                    tracing::info!("acme: {name}: the order replaces certificate {id}");
                    Ok(order)
                }
                // certmagic#361, lego#2475: a `replaces` the CA will not take (already
                // replaced, 409) must not keep the name from getting a certificate.
                Err(e) => {
                    tracing::info!(
                        "acme: {name}: order with `replaces` refused ({e}); ordering without"
                    );
                    self.rt.block_on(account.new_order(&new_order()))
                }
            },
            None => self.rt.block_on(account.new_order(&new_order())),
        };
        let mut order = order.map_err(|e| OrderError::Failed(format!("new order: {e}")))?;
        tracing::info!("acme: {name}: order placed ({})", challenge.name());
        let mut answered: Vec<ToServerUndo> = Vec::new();
        let result = self.authorize_and_finalize(&mut order, &name, challenge, &mut answered);
        for undo in answered {
            let message = |seq| match undo {
                ToServerUndo::TlsAlpn(identifier) => ToServer::TlsAlpn {
                    seq,
                    identifier,
                    cert_and_key: None,
                },
                ToServerUndo::Http01(token) => ToServer::Http01 {
                    seq,
                    token,
                    key_authorization: None,
                },
            };
            // A failed removal leaves a stale answer nobody asks for; only a server that is
            // gone ends the helper.
            if let Err(OrderError::Closed) = self.send_and_wait(message) {
                return Err(OrderError::Closed);
            }
        }
        result
    }

    fn authorize_and_finalize(
        &mut self,
        order: &mut instant_acme::Order,
        name: &str,
        challenge: ChallengeKind,
        answered: &mut Vec<ToServerUndo>,
    ) -> Result<(String, String), OrderError> {
        let failed =
            |what: &str, e: instant_acme::Error| OrderError::Failed(format!("{what}: {e}"));
        let kind = match challenge {
            ChallengeKind::TlsAlpn01 => ChallengeType::TlsAlpn01,
            ChallengeKind::Http01 => ChallengeType::Http01,
        };
        // The answers are made first (the handles borrow the order), then sent, then the
        // challenges are marked ready.
        let mut ready_urls = Vec::new();
        {
            let mut authorizations = order.authorizations();
            while let Some(authz) = self.rt.block_on(authorizations.next()) {
                let mut authz = authz.map_err(|e| failed("authorization", e))?;
                match authz.status {
                    AuthorizationStatus::Valid => continue,
                    AuthorizationStatus::Pending => {}
                    other => return Err(OrderError::Failed(format!("authorization is {other:?}"))),
                }
                let Some(handle) = authz.challenge(kind.clone()) else {
                    return Err(OrderError::Failed(format!(
                        "the CA offers no {} challenge",
                        challenge.name()
                    )));
                };
                let identifier = handle.identifier().identifier.clone();
                let key_auth = handle.key_authorization();
                let id_text = match &identifier {
                    Identifier::Ip(ip) => ip.to_string(),
                    Identifier::Dns(d) => d.clone(),
                    other => format!("{other:?}"),
                };
                let answer = match challenge {
                    ChallengeKind::TlsAlpn01 => {
                        let (cert, key) = tls_alpn_cert(&id_text, key_auth.digest().as_ref())
                            .map_err(OrderError::Failed)?;
                        Answer::TlsAlpn(id_text, cert, key)
                    }
                    ChallengeKind::Http01 => {
                        Answer::Http01(handle.token.clone(), key_auth.as_str().to_string())
                    }
                };
                ready_urls.push((answer, handle.url.clone()));
            }
        }
        for (answer, _) in &ready_urls {
            let sent = match answer.clone() {
                Answer::TlsAlpn(identifier, cert, key) => {
                    answered.push(ToServerUndo::TlsAlpn(identifier.clone()));
                    self.send_and_wait(|seq| ToServer::TlsAlpn {
                        seq,
                        identifier,
                        cert_and_key: Some((cert, key)),
                    })
                }
                Answer::Http01(token, key_authorization) => {
                    answered.push(ToServerUndo::Http01(token.clone()));
                    self.send_and_wait(|seq| ToServer::Http01 {
                        seq,
                        token,
                        key_authorization: Some(key_authorization),
                    })
                }
            };
            sent?;
        }
        // Now the CA may look.
        {
            let mut authorizations = order.authorizations();
            while let Some(authz) = self.rt.block_on(authorizations.next()) {
                let mut authz = authz.map_err(|e| failed("authorization", e))?;
                if authz.status != AuthorizationStatus::Pending {
                    continue;
                }
                let Some(mut handle) = authz.challenge(kind.clone()) else {
                    continue;
                };
                self.rt
                    .block_on(handle.set_ready())
                    .map_err(|e| failed("challenge", e))?;
            }
        }
        let retries = RetryPolicy::new().timeout(ORDER_TIMEOUT);
        let status = self
            .rt
            .block_on(order.poll_ready(&retries))
            .map_err(|e| failed("validation", e))?;
        if status != OrderStatus::Ready {
            let mut reasons = Vec::new();
            let mut authorizations = order.authorizations();
            while let Some(Ok(mut authz)) = self.rt.block_on(authorizations.next()) {
                if let Ok(state) = self.rt.block_on(authz.refresh()) {
                    for c in &state.challenges {
                        if let Some(e) = &c.error {
                            reasons.push(e.to_string());
                        }
                    }
                }
            }
            return Err(OrderError::Failed(format!(
                "{name}: validation by {} failed: {}",
                challenge.name(),
                if reasons.is_empty() {
                    format!("order is {status:?}")
                } else {
                    reasons.join("; ")
                }
            )));
        }
        let key = rcgen::KeyPair::generate().map_err(|e| OrderError::Failed(e.to_string()))?;
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()])
            .map_err(|e| OrderError::Failed(e.to_string()))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        let csr = params
            .serialize_request(&key)
            .map_err(|e| OrderError::Failed(e.to_string()))?;
        self.rt
            .block_on(order.finalize_csr(csr.der()))
            .map_err(|e| failed("finalize", e))?;
        let chain = self
            .rt
            .block_on(order.poll_certificate(&retries))
            .map_err(|e| failed("certificate", e))?;
        Ok((chain, key.serialize_pem()))
    }
}

#[derive(Clone)]
enum Answer {
    TlsAlpn(String, Vec<u8>, Vec<u8>),
    Http01(String, String),
}

enum ToServerUndo {
    TlsAlpn(String),
    Http01(String),
}

enum OrderError {
    Failed(String),
    Closed,
}

/// The TLS-ALPN-01 certificate (RFC 8737 §3): self-signed, the identifier as its only SAN,
/// and the critical acmeIdentifier extension holding SHA-256 of the key authorization.
fn tls_alpn_cert(identifier: &str, digest: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut params = rcgen::CertificateParams::new(vec![identifier.to_string()])
        .map_err(|e| format!("challenge certificate: {e}"))?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let key = rcgen::KeyPair::generate().map_err(|e| format!("challenge key: {e}"))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("challenge certificate: {e}"))?;
    Ok((cert.der().to_vec(), key.serialize_der()))
}

/// The leaf's validity, from a PEM file whose first certificate is the leaf.
fn parse_current(pem: &str) -> Result<Current, String> {
    let leaf = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or("no certificate")?
        .map_err(|e| format!("bad PEM: {e:?}"))?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| format!("cannot parse the certificate: {e}"))?;
    let validity = Validity {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    };
    Ok(Current {
        pem: pem.to_string(),
        validity,
        leaf: leaf.into_owned(),
    })
}

fn random_u64() -> u64 {
    use aws_lc_rs::rand::SecureRandom;
    let mut b = [0u8; 8];
    let _ = aws_lc_rs::rand::SystemRandom::new().fill(&mut b);
    u64::from_le_bytes(b)
}

/// base64url without padding (or with), as EAB keys are given.
fn base64_url_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_decodes_eab_keys() {
        assert_eq!(base64_url_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_url_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_url_decode("_-8").unwrap(), vec![0xff, 0xef]);
        assert!(base64_url_decode("a b").is_none());
    }

    #[test]
    fn the_challenge_certificate_carries_the_digest_in_a_critical_extension() {
        let digest = [7u8; 32];
        let (der, _key) = tls_alpn_cert("127.0.0.1", &digest).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let ext = cert
            .extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == "1.3.6.1.5.5.7.1.31")
            .expect("acmeIdentifier");
        assert!(ext.critical);
        // An OCTET STRING of the 32 bytes.
        assert_eq!(&ext.value[..2], &[0x04, 32]);
        assert_eq!(&ext.value[2..], &digest);
        let san = cert.subject_alternative_name().unwrap().unwrap();
        assert_eq!(san.value.general_names.len(), 1);
    }

    #[test]
    fn a_leaf_gives_its_validity() {
        let made = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        let pem = format!("{}{}", made.cert.pem(), made.signing_key.serialize_pem());
        let current = parse_current(&pem).unwrap();
        assert!(current.validity.not_after > current.validity.not_before);
        assert!(parse_current("nothing").is_err());
    }
}
