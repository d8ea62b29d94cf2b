//! The gate's own addresses, under its prefix (`/.tern-gate` by default):
//!
//! | address | what |
//! |---|---|
//! | `GET enter?return=P` | whatever `P` needs: a challenge, a login form, or 303 to `P` |
//! | `GET login?realm=R&return=P`, `POST login` | the login form and its check |
//! | `POST logout` | ends a realm's session |
//! | `GET guest?realm=R&return=P` | the proof-of-work guest login of realm `R` |
//! | `POST pass` (or `GET` from a time-lock's refresh) | a solved challenge becomes a session |
//! | `GET challenge.js`, `worker.js`, `gate.css` | the page assets |
//! | `GET statusz`, `metrics` | counters, for this machine and trusted proxies, by client address |
//!
//! and, for `tern gate` behind nginx, `GET /auth` (configurable): 204 when the original
//! request may pass (with `X-Auth-User` and `X-Auth-Realm` when a password session names the
//! client), 401 with `X-Gate-Location` (where nginx should send the browser) when it needs a
//! challenge or a login, 403 when it is denied or is not GET/HEAD and no session settles it.

use std::sync::Arc;

use tern_server::{
    Body, Guarded, Handler, HandlerContext, Method, Reply, Request, Response, Router,
};
use tern_services::metrics;

use crate::checkers;
use crate::form;
use crate::guard::{page, set_cookie, Client, Need, Outcome};
use crate::pages;
use crate::pool;
use crate::pow::{self, PowError};
use crate::redirect::safe_return_path;
use crate::state::{Gate, Loaded};
use crate::stats::C;
use crate::token;

/// Longest password the gate will hash (bcrypt reads 72 bytes; argon2 any).
const MAX_PASSWORD: usize = 1024;

impl Gate {
    /// `inner` behind the gate, with the gate's own addresses in front of it.
    pub fn protect(&self, inner: Router) -> Router {
        let prefix = format!("{}/", self.config().config.path_prefix);
        let endpoints = Endpoints { gate: self.clone() };
        Router::new()
            .prefix(Method::Get, &prefix, endpoints.clone())
            .prefix(Method::Post, &prefix, endpoints)
            .fallback(Guarded::new(Arc::new(self.clone()), inner))
    }

    /// The gate's own addresses (everything under its prefix), for a router that mounts them
    /// itself, such as `tern run`'s sites.
    pub fn endpoints(&self) -> impl Handler {
        Endpoints { gate: self.clone() }
    }

    /// The router of `tern gate`: the auth endpoint for nginx, the gate's own addresses, and
    /// /statusz and /metrics (loopback and trusted proxies only).
    pub fn auth_router(&self) -> Router {
        let loaded = self.config();
        let prefix = format!("{}/", loaded.config.path_prefix);
        let endpoints = Endpoints { gate: self.clone() };
        let auth = AuthEndpoint { gate: self.clone() };
        let stats = endpoints.clone();
        Router::new()
            .route(Method::Get, &loaded.config.auth_path, auth)
            .prefix(Method::Get, &prefix, endpoints.clone())
            .prefix(Method::Post, &prefix, endpoints)
            .get("/statusz", StatsPage(stats.clone(), false))
            .get("/metrics", StatsPage(stats, true))
    }
}

impl Handler for Endpoints {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        self.dispatch(req, cx)
    }
}

impl Handler for AuthEndpoint {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        self.answer(req, cx)
    }
}

struct StatsPage(Endpoints, bool);

impl Handler for StatsPage {
    fn handle(&self, req: &Request<'_>, _: &mut HandlerContext<'_>) -> Reply {
        self.0.stats_page(req, self.1).into()
    }
}

#[derive(Clone)]
pub(crate) struct Endpoints {
    gate: Gate,
}

impl Endpoints {
    fn dispatch(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        let loaded = self.gate.config();
        let config = &loaded.config;
        let Some(name) = req
            .path()
            .strip_prefix(config.path_prefix.as_str())
            .and_then(|p| p.strip_prefix('/'))
        else {
            return Response::text(404, "not found\n").into();
        };
        let post = req.method() == Method::Post;
        let client = self.gate.client(config, req);
        let worker = cx.worker_id;
        let query = req.query().unwrap_or("").as_bytes();
        let return_to = |fields: &[u8]| -> String {
            form::value(fields, "return")
                .as_deref()
                .and_then(safe_return_path)
                .unwrap_or("/")
                .to_string()
        };
        match (name, post) {
            ("enter", false) => {
                let target = return_to(query);
                let path = target.split('?').next().unwrap_or("/");
                let outcome = match crate::path::canonical(path) {
                    Some(path) => self
                        .gate
                        .decide(&loaded, req, &client, "GET", &path, worker),
                    None => Outcome::Deny,
                };
                self.gate
                    .answer(&loaded, req, &client, outcome, &target, worker)
                    .into()
            }
            ("login", false) => self.login_form(&loaded, req, &client, query, None).into(),
            ("login", true) => self.login(&loaded, req, &client, cx),
            ("logout", true) => self.logout(&loaded, req, &client).into(),
            ("guest", false) => {
                let target = return_to(query);
                match form::value(query, "realm").and_then(|r| config.realm(&r).map(|(i, _)| i)) {
                    Some(i) if config.realms[i].has_guest() => self
                        .gate
                        .challenge(
                            &loaded,
                            req,
                            &client,
                            config.realms[i].guest_difficulty,
                            0,
                            u16::MAX,
                            i as u8 + 1,
                            &target,
                            worker,
                        )
                        .into(),
                    _ => Response::text(404, "no guest login for this realm\n").into(),
                }
            }
            ("pass", _) => {
                let fields = if post { req.body } else { query };
                self.pass(&loaded, req, &client, fields, worker).into()
            }
            ("challenge.js", false) => asset(pages::CHALLENGE_JS, "text/javascript"),
            ("worker.js", false) => asset(pages::WORKER_JS, "text/javascript"),
            ("gate.css", false) => asset(pages::GATE_CSS, "text/css"),
            ("statusz", false) => self.stats_page(req, false).into(),
            ("metrics", false) => self.stats_page(req, true).into(),
            (_, true) | (_, false) => Response::text(404, "not found\n").into(),
        }
    }

    /// Counters, shown only to this machine and the trusted proxies themselves, judged by
    /// the client's address (a request nginx relays is the world's): they tell an attacker
    /// which of its tricks are being caught.
    fn stats_page(&self, req: &Request<'_>, prometheus: bool) -> Response {
        let loaded = self.gate.config();
        if !metrics::may_read_counters(req, &loaded.config.trusted_proxies) {
            return metrics::counters_refused();
        }
        let started = *STARTED.get_or_init(std::time::Instant::now);
        // The gate's counters are among them once `Gate::install` has run.
        metrics::page(&metrics::process_metrics(started), prometheus)
    }

    fn login_form(
        &self,
        loaded: &Loaded,
        req: &Request<'_>,
        client: &Client,
        query: &[u8],
        error: Option<&str>,
    ) -> Response {
        let config = &loaded.config;
        let realm = form::value(query, "realm");
        let Some((index, r)) = realm.as_deref().and_then(|name| config.realm(name)) else {
            return Response::text(404, "no such realm\n");
        };
        let return_to = form::value(query, "return")
            .as_deref()
            .and_then(safe_return_path)
            .unwrap_or("/")
            .to_string();
        let keyring = self.gate.inner.keyring.load();
        let csrf = crate::csrf::issue(&keyring, client.net, req.unix_secs);
        let sessions = self
            .gate
            .sessions(loaded, req, client, Need::Login { realm: index }, 0);
        if let (true, Some(identity)) = (sessions.settled, sessions.identity) {
            let user = identity.user();
            return page(
                200,
                pages::logged_in_page(&pages::LoggedIn {
                    prefix: &config.path_prefix,
                    realm: &r.name,
                    user,
                    csrf: &csrf,
                    return_to: &return_to,
                }),
            );
        }
        page(
            if error.is_some() { 401 } else { 200 },
            pages::login_page(&pages::LoginPage {
                prefix: &config.path_prefix,
                realm: &r.name,
                return_to: &return_to,
                csrf: &csrf,
                error,
                guest: r.has_guest(),
                user: "",
            }),
        )
    }

    /// Checks a login form on the worker (origin, CSRF token, rate limits), then hands the
    /// password to the pool and defers the answer.
    fn login(
        &self,
        loaded: &Arc<Loaded>,
        req: &Request<'_>,
        client: &Client,
        cx: &mut HandlerContext<'_>,
    ) -> Reply {
        let config = &loaded.config;
        let worker = cx.worker_id;
        let stats = self.gate.stats();
        let body = req.body;
        if !crate::csrf::same_origin(
            req.header("origin"),
            req.header("sec-fetch-site"),
            req.header("host"),
        ) {
            stats.bump(worker, C::LoginForged);
            return Response::text(403, "a login form from another site was refused\n").into();
        }
        let (Some(realm), Some(user), Some(password)) = (
            form::value(body, "realm"),
            form::value(body, "user"),
            form::value(body, "password"),
        ) else {
            return Response::text(400, "the login form needs realm, user and password\n").into();
        };
        let Some((index, r)) = config.realm(&realm) else {
            return Response::text(404, "no such realm\n").into();
        };
        let return_to = form::value(body, "return")
            .as_deref()
            .and_then(safe_return_path)
            .unwrap_or("/")
            .to_string();
        let retry = |error: &str, status: u16| -> Reply {
            let mut query = format!(
                "realm={}&return={}",
                form::encode(&r.name),
                form::encode(&return_to)
            );
            query.shrink_to_fit();
            let mut response = self.login_form(loaded, req, client, query.as_bytes(), Some(error));
            response.status = status;
            response.into()
        };
        let keyring = self.gate.inner.keyring.load();
        let csrf_ok = form::value(body, "csrf")
            .is_some_and(|t| crate::csrf::verify(&keyring, &t, client.net, req.unix_secs).is_ok());
        if !csrf_ok {
            stats.bump(worker, C::LoginForged);
            return retry("The form had expired. Please try again.", 403);
        }
        if !r.has_passwords() || !checkers::valid_user(&user) || password.len() > MAX_PASSWORD {
            stats.bump(worker, C::LoginRefused);
            return retry("Wrong user name or password.", 401);
        }
        if !self.gate.inner.login_buckets.take(&client.net, req.now_ms) {
            stats.bump(worker, C::LoginRateLimited);
            let mut reply = retry(
                "Too many login attempts from your network. Wait a minute.",
                429,
            );
            if let Reply::Now(r) = &mut reply {
                r.push_header("Retry-After", b"60");
            }
            return reply;
        }
        if !self
            .gate
            .inner
            .failures
            .allowed(&client.net, &r.name, &user, req.unix_secs)
        {
            stats.bump(worker, C::LoginLockedOut);
            return retry(
                "Too many wrong passwords for this user from your network. Try again later.",
                429,
            );
        }
        // Everything the pool thread needs, owned.
        let check = LoginCheck {
            gate: self.gate.clone(),
            loaded: loaded.clone(),
            realm: index,
            user: user.into_owned(),
            password: password.into_owned(),
            return_to,
            net: client.net,
            bound: client.bound,
            ua_hash: pow::ua_hash(req.header("user-agent").unwrap_or(b"")),
            secure: client.secure,
            now: req.unix_secs,
        };
        let claim = pool::Claim {
            network: client.net,
            suspect: self
                .gate
                .inner
                .failures
                .network_failed_recently(&client.net, req.unix_secs),
        };
        let job = LoginJob {
            check,
            pending: cx.defer(),
        };
        match self.gate.inner.pool.try_run(claim, job) {
            Ok(()) => Reply::Later,
            Err((_, job)) => {
                job.pending.cancel();
                stats.bump(worker, C::LoginBusy);
                busy().into()
            }
        }
    }

    fn logout(&self, loaded: &Loaded, req: &Request<'_>, client: &Client) -> Response {
        let config = &loaded.config;
        let body = req.body;
        let keyring = self.gate.inner.keyring.load();
        let same_site = crate::csrf::same_origin(
            req.header("origin"),
            req.header("sec-fetch-site"),
            req.header("host"),
        );
        let csrf_ok = form::value(body, "csrf")
            .is_some_and(|t| crate::csrf::verify(&keyring, &t, client.net, req.unix_secs).is_ok());
        if !same_site || !csrf_ok {
            return Response::text(403, "a logout form from another site was refused\n");
        }
        let realm = form::value(body, "realm").unwrap_or_default();
        if !realm.is_empty() && config.realm(&realm).is_none() {
            return Response::text(404, "no such realm\n");
        }
        let return_to = form::value(body, "return")
            .as_deref()
            .and_then(safe_return_path)
            .unwrap_or("/")
            .to_string();
        Response::new(303)
            .with_header("Location", &return_to)
            .with_header("Cache-Control", "no-store")
            .with_header(
                "Set-Cookie",
                &set_cookie(config, client.secure, &realm, "", 0),
            )
    }

    /// A solved challenge (or an elapsed time-lock) becomes a session cookie.
    fn pass(
        &self,
        loaded: &Loaded,
        req: &Request<'_>,
        client: &Client,
        fields: &[u8],
        worker: usize,
    ) -> Response {
        let config = &loaded.config;
        let stats = self.gate.stats();
        if !self
            .gate
            .inner
            .challenge_buckets
            .take(&client.net, req.now_ms)
        {
            stats.bump(worker, C::ChallengeRateLimited);
            return Response::text(429, "too many answers from your network; wait a minute\n")
                .with_header("Retry-After", "60");
        }
        let return_to = form::value(fields, "return")
            .as_deref()
            .and_then(safe_return_path)
            .unwrap_or("/")
            .to_string();
        let challenge = form::value(fields, "challenge").unwrap_or_default();
        let counter = form::value(fields, "counter").unwrap_or_default();
        let keyring = self.gate.inner.keyring.load();
        let ua = pow::ua_hash(req.header("user-agent").unwrap_or(b""));
        let spec = match pow::verify(
            &keyring,
            &challenge,
            &counter,
            req.unix_secs,
            client.bound,
            ua,
            &self.gate.inner.replay,
        ) {
            Ok(spec) => spec,
            Err(e) => {
                stats.bump(worker, failure_counter(&e));
                let (status, text) = match e {
                    PowError::ReplayFull => {
                        (503, "Too many checks are in flight. Try again in a minute.")
                    }
                    PowError::TooEarly => (
                        403,
                        "That was too quick. Go back and wait for the page to continue.",
                    ),
                    PowError::Expired => (403, "The check expired. Go back and reload the page."),
                    _ => (403, "The check failed. Go back and reload the page."),
                };
                return page(status, pages::message_page("Check failed", text));
            }
        };
        let realm = match spec.realm_hint {
            0 => None,
            n => match config.realms.get(usize::from(n) - 1) {
                Some(r) if r.has_guest() => Some(r),
                _ => {
                    stats.bump(worker, C::FailedMalformed);
                    return page(
                        403,
                        pages::message_page("Check failed", "That login no longer exists."),
                    );
                }
            },
        };
        let now = req.unix_secs;
        let session = token::Session {
            realm: realm.map_or("", |r| r.name.as_str()),
            user: "guest",
            issued: now,
            expires: now + config.session_lifetime.as_secs(),
            realm_version: realm.map_or(0, |r| r.version),
            prefix: client.bound,
            // What the answer was checked against: this client's user agent.
            ua_hash: ua,
            proof: match spec.difficulty {
                0 => token::Proof::TimeLock {
                    seconds: spec.seconds,
                },
                bits => token::Proof::Work { bits },
            },
            kid: 0,
        };
        let Ok(value) = token::issue(&keyring, &session) else {
            return Response::text(500, "could not make a session\n");
        };
        stats.bump(worker, C::Passed);
        Response::new(303)
            .with_header("Location", &return_to)
            .with_header("Cache-Control", "no-store")
            .with_header(
                "Set-Cookie",
                &set_cookie(
                    config,
                    client.secure,
                    session.realm,
                    &value,
                    config.session_lifetime.as_secs(),
                ),
            )
    }
}

static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn failure_counter(e: &PowError) -> C {
    match e {
        PowError::Malformed => C::FailedMalformed,
        PowError::UnknownKey => C::FailedUnknownKey,
        PowError::BadMac => C::FailedBadMac,
        PowError::Expired => C::FailedExpired,
        PowError::TooEarly => C::FailedTooEarly,
        PowError::WrongPrefix => C::FailedWrongPrefix,
        PowError::WrongClient => C::FailedWrongClient,
        PowError::TooEasy => C::FailedTooEasy,
        PowError::Replayed => C::FailedReplayed,
        PowError::ReplayFull => C::FailedReplayFull,
    }
}

fn asset(text: &'static str, content_type: &str) -> Reply {
    Response::new(200)
        .with_header("Content-Type", &format!("{content_type}; charset=utf-8"))
        .with_header("Cache-Control", "public, max-age=3600")
        .with_header("X-Content-Type-Options", "nosniff")
        .with_body(Body::Static(text.as_bytes()))
        .into()
}

/// The answer when the check pool has no place for a login (or gave its place away).
fn busy() -> Response {
    page(
        503,
        pages::message_page(
            "Busy",
            "Too many logins are being checked right now. Try again in a few seconds.",
        ),
    )
    .with_header("Retry-After", "5")
}

/// A login waiting for the check pool, and the reply it owes.
struct LoginJob {
    check: LoginCheck,
    pending: tern_server::Pending,
}

impl pool::Job for LoginJob {
    fn run(self: Box<Self>) {
        let response = self.check.run();
        tern_server::Pending::complete_retrying(self.pending, response);
    }

    fn shed(self: Box<Self>) {
        let stats = self.check.gate.stats();
        stats.bump(stats.pool_slot(), C::LoginBusy);
        // On a worker: no waiting for a full inbox (a dropped Pending answers 500 instead).
        let _ = self.pending.complete(busy());
    }
}

/// A password check, run on a pool thread.
struct LoginCheck {
    gate: Gate,
    loaded: Arc<Loaded>,
    realm: usize,
    user: String,
    password: String,
    return_to: String,
    net: crate::prefix::Prefix,
    bound: crate::prefix::Prefix,
    ua_hash: u64,
    secure: bool,
    now: u64,
}

impl LoginCheck {
    fn run(&self) -> Response {
        let config = &self.loaded.config;
        let realm = &config.realms[self.realm];
        let stats = self.gate.stats();
        let slot = stats.pool_slot();
        let failures = &self.gate.inner.failures;
        let keyring = self.gate.inner.keyring.load();
        let again = |status: u16, error: &str| {
            let csrf = crate::csrf::issue(&keyring, self.net, self.now);
            page(
                status,
                pages::login_page(&pages::LoginPage {
                    prefix: &config.path_prefix,
                    realm: &realm.name,
                    return_to: &self.return_to,
                    csrf: &csrf,
                    error: Some(error),
                    guest: realm.has_guest(),
                    user: &self.user,
                }),
            )
        };
        let helpers = self.gate.inner.exec_helpers.get();
        match checkers::check(realm, &self.user, self.password.as_bytes(), helpers) {
            checkers::Verdict::Accepted => {
                failures.clear(&self.net, &realm.name, &self.user);
                let session = token::Session {
                    realm: &realm.name,
                    user: &self.user,
                    issued: self.now,
                    expires: self.now + config.session_lifetime.as_secs(),
                    realm_version: realm.version,
                    prefix: self.bound,
                    ua_hash: self.ua_hash,
                    proof: token::Proof::Password,
                    kid: 0,
                };
                let Ok(value) = token::issue(&keyring, &session) else {
                    return Response::text(500, "could not make a session\n");
                };
                stats.bump(slot, C::LoginAccepted);
                tracing::info!(realm = %realm.name, user = %self.user, "gate: login accepted");
                Response::new(303)
                    .with_header("Location", &self.return_to)
                    .with_header("Cache-Control", "no-store")
                    .with_header(
                        "Set-Cookie",
                        &set_cookie(
                            config,
                            self.secure,
                            &realm.name,
                            &value,
                            config.session_lifetime.as_secs(),
                        ),
                    )
            }
            checkers::Verdict::Refused => {
                failures.record(&self.net, &realm.name, &self.user, self.now);
                stats.bump(slot, C::LoginRefused);
                again(401, "Wrong user name or password.")
            }
            checkers::Verdict::Unavailable(why) => {
                stats.bump(slot, C::LoginUnavailable);
                tracing::error!(realm = %realm.name, "gate: cannot check passwords: {why}");
                again(
                    503,
                    "Passwords cannot be checked right now. Try again later.",
                )
            }
        }
    }
}

/// `GET /auth` for nginx's `auth_request`: decides about the original request, which nginx
/// names in `X-Original-URI` and `X-Original-Method`.
pub(crate) struct AuthEndpoint {
    gate: Gate,
}

impl AuthEndpoint {
    fn answer(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        let loaded = self.gate.config();
        let config = &loaded.config;
        let client = self.gate.client(config, req);
        let uri = req
            .header("x-original-uri")
            .and_then(|v| std::str::from_utf8(v).ok())
            .unwrap_or("/");
        let method = req
            .header("x-original-method")
            .and_then(|v| std::str::from_utf8(v).ok())
            .unwrap_or("GET");
        // nginx matched its location on its own normalised path; a path without a canonical
        // form is one nginx and the app behind it may read differently from the gate, so it
        // is refused (and counted), never judged as sent.
        let Some(path) = crate::path::canonical(uri.split('?').next().unwrap_or("/")) else {
            self.gate.stats().bump(cx.worker_id, C::PathRefused);
            return Response::new(403).into();
        };
        // No bodies on these answers: nginx does not read an auth subrequest's body, so one
        // would cost it the kept-alive connection to the gate.
        match self
            .gate
            .decide(&loaded, req, &client, method, &path, cx.worker_id)
        {
            Outcome::Pass(identity) => {
                let mut r = Response::new(204).with_header("Cache-Control", "no-store");
                // A realm session, when there is one, is named to the app whatever the
                // policy said.
                if let Some(id) = identity {
                    r.push_header("X-Auth-User", id.user().as_bytes());
                    r.push_header("X-Auth-Realm", id.realm().as_bytes());
                }
                r.into()
            }
            // Never redirect a form post to a challenge page: it would come back as a GET.
            Outcome::Deny | Outcome::NotForThisMethod => Response::new(403).into(),
            Outcome::Challenge { .. } | Outcome::TimeLock { .. } | Outcome::Login { .. } => {
                let target = safe_return_path(uri).unwrap_or("/");
                let location = format!(
                    "{}/enter?return={}",
                    config.path_prefix,
                    form::encode(target)
                );
                Response::new(401)
                    .with_header("X-Gate-Location", &location)
                    .with_header("Cache-Control", "no-store")
                    .into()
            }
        }
    }
}
