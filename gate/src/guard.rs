//! The gate's decision for one request, on the worker: the bot policy's verdict, then, when
//! that asks for a challenge or a login, whether the client's session cookie already settles
//! it. A valid session costs one MAC, one hash of the user agent and no allocation.
//!
//! A session settles only what it paid for (time-lock < proof of work < password; see
//! [`settles`]), for the user agent it was issued to, on the network it was issued to.

use std::net::IpAddr;

use tern_server::{Guard, HandlerContext, Identity, Reply, Request, Response, Verdict};

use crate::config::{GateConfig, SecureCookies};
use crate::keyring::Keyring;
use crate::path::policy_path;
use crate::policy::Action;
use crate::prefix::Prefix;
use crate::state::{Gate, Loaded};
use crate::stats::C;
use crate::token::{self, Proof, TokenError};
use crate::{pages, pow};

/// Who is asking, as far as the gate cares.
pub(crate) struct Client {
    pub ip: IpAddr,
    /// The client's network (for rate limits, always).
    pub net: Prefix,
    /// What sessions and challenges are bound to (`Prefix::UNBOUND` when binding is off).
    pub bound: Prefix,
    /// Cookies are `Secure` and `__Host-` prefixed.
    pub secure: bool,
}

/// What the gate wants done with a request.
pub(crate) enum Outcome {
    /// Let it through, as the account a password session names when the client has one.
    Pass(Option<Identity>),
    Deny,
    Challenge {
        difficulty: u8,
        rule: u16,
    },
    TimeLock {
        seconds: u32,
        rule: u16,
    },
    Login {
        realm: usize,
    },
    /// A challenge or login is due, but the method is not GET or HEAD: a challenge page could
    /// not carry the request through, and turning it into a GET would lose it.
    NotForThisMethod,
}

/// What a session must have been earned with to settle a decision.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Need {
    /// Nothing: the request may pass anyway; a password session only names the client.
    Nothing,
    TimeLock {
        seconds: u32,
    },
    Work {
        bits: u8,
    },
    /// A session of this realm (index): a password login, or the realm's guest login while
    /// the realm still offers one at no lower difficulty.
    Login {
        realm: usize,
    },
}

/// Whether a session of `realm` (None: a challenge pass) earned with `proof` settles `need`.
/// Dearer proofs settle cheaper needs: a proof of work settles any time-lock, a password
/// login of any realm settles any time-lock and any proof of work (an account holder is not
/// a scraper), never the other way round.
pub(crate) fn settles(config: &GateConfig, realm: Option<usize>, proof: Proof, need: Need) -> bool {
    match need {
        Need::Nothing => true,
        Need::TimeLock { seconds } => match proof {
            Proof::TimeLock { seconds: paid } => u32::from(paid) >= seconds,
            Proof::Work { .. } | Proof::Password => true,
        },
        Need::Work { bits } => match proof {
            Proof::Work { bits: paid } => paid >= bits,
            Proof::Password => true,
            Proof::TimeLock { .. } => false,
        },
        Need::Login { realm: wanted } => {
            let r = &config.realms[wanted];
            realm == Some(wanted)
                && match proof {
                    Proof::Password => true,
                    Proof::Work { bits } => r.has_guest() && bits >= r.guest_difficulty,
                    Proof::TimeLock { .. } => false,
                }
        }
    }
}

/// What a client's session cookies amount to for one decision.
pub(crate) struct Sessions {
    /// One of them settles the need.
    pub settled: bool,
    /// The account a valid password session names (the one that settled a login need).
    pub identity: Option<Identity>,
}

impl Gate {
    pub(crate) fn client(&self, config: &GateConfig, req: &Request<'_>) -> Client {
        let ip = config.trusted_proxies.client_ip(req.peer, req.head);
        let net = Prefix::of(ip, config.ipv4_prefix, config.ipv6_prefix);
        let secure = match config.secure_cookies {
            SecureCookies::Always => true,
            SecureCookies::Never => false,
            SecureCookies::Auto => {
                req.secure
                    || (config.trusted_proxies.is_trusted(req.peer.ip())
                        && req
                            .header("x-forwarded-proto")
                            .is_some_and(|v| v.eq_ignore_ascii_case(b"https")))
            }
        };
        Client {
            ip,
            net,
            bound: if config.bind_to_network {
                net
            } else {
                Prefix::UNBOUND
            },
            secure,
        }
    }

    /// The policy's verdict on `method path` (a canonical path: see [`canonical`](crate::path::canonical)) for this
    /// client, settled by its session where one can settle it. A request that is not GET or
    /// HEAD is judged like any other: when
    /// the policy wants a check, only a session that settles it lets the request through.
    pub(crate) fn decide(
        &self,
        loaded: &Loaded,
        req: &Request<'_>,
        client: &Client,
        method: &str,
        path: &str,
        worker: usize,
    ) -> Outcome {
        let path = policy_path(path);
        let decision = loaded
            .policy
            .evaluate(method, &path, |name| req.header(name), client.ip);
        loaded.decisions.bump(worker, decision.rule as usize);
        let need = match decision.action {
            Action::Allow => Need::Nothing,
            Action::Deny => return Outcome::Deny,
            Action::Challenge { difficulty } => Need::Work { bits: difficulty },
            Action::TimeLock { seconds } => Need::TimeLock { seconds },
            Action::Login { realm } => Need::Login {
                realm: realm as usize,
            },
        };
        let sessions = self.sessions(loaded, req, client, need, worker);
        if sessions.settled {
            return Outcome::Pass(sessions.identity);
        }
        if !matches!(method, "GET" | "HEAD") {
            return Outcome::NotForThisMethod;
        }
        match decision.action {
            Action::Challenge { difficulty } => Outcome::Challenge {
                difficulty,
                rule: decision.rule,
            },
            Action::TimeLock { seconds } => Outcome::TimeLock {
                seconds,
                rule: decision.rule,
            },
            Action::Login { realm } => Outcome::Login {
                realm: realm as usize,
            },
            Action::Allow | Action::Deny => Outcome::Pass(None),
        }
    }

    /// Checks the client's gate cookies against `need`: whether one settles it, and which
    /// account a password session names. Cookies that fail are counted by cause and otherwise
    /// ignored (never deleted: a stale cookie of one realm must not cost the client its good
    /// one of another). Only cookies that could matter are checked: for a login, that realm's;
    /// for nothing, the realms' (a challenge pass names no one).
    pub(crate) fn sessions(
        &self,
        loaded: &Loaded,
        req: &Request<'_>,
        client: &Client,
        need: Need,
        worker: usize,
    ) -> Sessions {
        let config = &loaded.config;
        let mut found = Sessions {
            settled: matches!(need, Need::Nothing),
            identity: None,
        };
        let mut too_weak = false;
        // Hashed only once a gate cookie is there to compare it with.
        let mut ua_hash = None;
        let keyring = self.inner.keyring.load();
        let mut buf = [0u8; token::MAX_TOKEN];
        let crumbs = req
            .head
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("cookie"))
            .flat_map(|line| line.value.split(|&b| b == b';'));
        for crumb in crumbs {
            let crumb = trim(crumb);
            let Some(eq) = crumb.iter().position(|&b| b == b'=') else {
                continue;
            };
            let Some(realm) = cookie_realm(config, client.secure, &crumb[..eq]) else {
                continue;
            };
            let realm_index = match realm {
                None => None,
                Some(name) => match config.realms.iter().position(|r| r.name.as_bytes() == name) {
                    Some(i) => Some(i),
                    None => continue,
                },
            };
            let wanted = match need {
                Need::Login { realm } => realm_index == Some(realm),
                Need::Nothing => realm_index.is_some(),
                Need::TimeLock { .. } | Need::Work { .. } => {
                    !found.settled || (realm_index.is_some() && found.identity.is_none())
                }
            };
            if !wanted {
                continue;
            }
            let ua = *ua_hash
                .get_or_insert_with(|| pow::ua_hash(req.header("user-agent").unwrap_or(b"")));
            let session = match self.check_session(
                &keyring,
                config,
                &crumb[eq + 1..],
                &mut buf,
                client,
                ua,
                realm_index,
                req.unix_secs,
            ) {
                Ok(session) => session,
                Err(cause) => {
                    self.stats().bump(worker, cause);
                    continue;
                }
            };
            if settles(config, realm_index, session.proof, need) {
                found.settled = true;
            } else {
                too_weak = true;
            }
            // Only an account names the client: a guest login is a proof of work that a realm
            // offering guests lets through, nobody the app should take for a user.
            if session.proof == Proof::Password && found.identity.is_none() {
                found.identity = Identity::new(session.realm, session.user);
            }
            if found.settled && found.identity.is_some() {
                break;
            }
        }
        if too_weak && !found.settled {
            self.stats().bump(worker, C::SessionTooWeak);
        }
        found
    }

    #[allow(clippy::too_many_arguments)]
    fn check_session<'b>(
        &self,
        keyring: &Keyring,
        config: &GateConfig,
        value: &[u8],
        buf: &'b mut [u8; token::MAX_TOKEN],
        client: &Client,
        ua_hash: u64,
        realm_index: Option<usize>,
        now: u64,
    ) -> Result<token::Session<'b>, C> {
        let session = token::verify(keyring, value, buf, now).map_err(|e| match e {
            TokenError::Expired => C::SessionExpired,
            TokenError::BadMac => C::SessionBadMac,
            TokenError::UnknownKey => C::SessionUnknownKey,
            _ => C::SessionMalformed,
        })?;
        if config.bind_to_network && session.prefix != client.bound {
            return Err(C::SessionWrongPrefix);
        }
        if session.ua_hash != ua_hash {
            return Err(C::SessionWrongClient);
        }
        // The cookie's name and the token must agree on the realm (a pass is realm "").
        match realm_index {
            None if session.realm.is_empty() => Ok(session),
            Some(i) if session.realm == config.realms[i].name => {
                if session.realm_version == config.realms[i].version {
                    Ok(session)
                } else {
                    Err(C::SessionStaleRealm)
                }
            }
            _ => Err(C::SessionBadMac),
        }
    }

    /// The challenge page for this client (or 429 when its network asks for too many).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn challenge(
        &self,
        loaded: &Loaded,
        req: &Request<'_>,
        client: &Client,
        difficulty: u8,
        seconds: u32,
        rule: u16,
        realm_hint: u8,
        return_to: &str,
        worker: usize,
    ) -> Response {
        let config = &loaded.config;
        if !self.inner.challenge_buckets.take(&client.net, req.now_ms) {
            self.stats().bump(worker, C::ChallengeRateLimited);
            return page(
                429,
                pages::message_page(
                    "Too many requests",
                    "Your network has asked for too many checks. Wait a minute, then reload.",
                ),
            )
            .with_header("Retry-After", "60");
        }
        let now = req.unix_secs;
        let spec = pow::ChallengeSpec {
            expires: now + config.challenge_lifetime.as_secs(),
            not_before: if difficulty == 0 {
                now + u64::from(seconds)
            } else {
                now
            },
            prefix: client.bound,
            ua_hash: pow::ua_hash(req.header("user-agent").unwrap_or(b"")),
            rule,
            difficulty,
            realm_hint,
            // The policy allows 1 to 60 seconds.
            seconds: u8::try_from(seconds).unwrap_or(u8::MAX),
        };
        let challenge = pow::issue(&self.inner.keyring.load(), &spec);
        let prefix = config.path_prefix.as_str();
        if difficulty == 0 {
            self.stats().bump(worker, C::IssuedTimeLock);
            page(
                403,
                pages::timelock_page(&pages::TimeLockPage {
                    prefix,
                    challenge: &challenge,
                    seconds,
                    return_to,
                }),
            )
        } else {
            self.stats().bump(worker, C::IssuedPow);
            page(
                403,
                pages::challenge_page(&pages::ChallengePage {
                    prefix,
                    challenge: &challenge,
                    difficulty,
                    return_to,
                }),
            )
        }
    }

    /// The answer for an outcome other than `Pass`, in guard mode or at `{prefix}/enter`.
    pub(crate) fn answer(
        &self,
        loaded: &Loaded,
        req: &Request<'_>,
        client: &Client,
        outcome: Outcome,
        return_to: &str,
        worker: usize,
    ) -> Response {
        let config = &loaded.config;
        match outcome {
            Outcome::Pass(_) => Response::new(303)
                .with_header("Location", return_to)
                .with_header("Cache-Control", "no-store"),
            Outcome::Deny => page(403, pages::deny_page(&config.path_prefix)),
            Outcome::NotForThisMethod => Response::text(
                403,
                "this address needs a browser check or a login first: open it with GET, then retry\n",
            ),
            Outcome::Challenge { difficulty, rule } => {
                self.challenge(loaded, req, client, difficulty, 0, rule, 0, return_to, worker)
            }
            Outcome::TimeLock { seconds, rule } => {
                self.challenge(loaded, req, client, 0, seconds, rule, 0, return_to, worker)
            }
            Outcome::Login { realm } => {
                let r = &config.realms[realm];
                if !r.has_passwords() {
                    // A guest-only realm: the "login" is the guest challenge itself.
                    return self.challenge(
                        loaded,
                        req,
                        client,
                        r.guest_difficulty,
                        0,
                        u16::MAX,
                        realm as u8 + 1,
                        return_to,
                        worker,
                    );
                }
                let csrf = crate::csrf::issue(&self.inner.keyring.load(), client.net, req.unix_secs);
                page(
                    401,
                    pages::login_page(&pages::LoginPage {
                        prefix: &config.path_prefix,
                        realm: &r.name,
                        return_to,
                        csrf: &csrf,
                        error: None,
                        guest: r.has_guest(),
                        user: "",
                    }),
                )
            }
        }
    }
}

impl Guard for Gate {
    fn check(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Verdict {
        let loaded = self.inner.loaded.load();
        let client = self.client(&loaded.config, req);
        let outcome = self.decide(
            &loaded,
            req,
            &client,
            req.head.method_str,
            req.path(),
            cx.worker_id,
        );
        match outcome {
            Outcome::Pass(None) => return Verdict::Pass,
            Outcome::Pass(Some(identity)) => return Verdict::PassAs(identity),
            _ => {}
        }
        let return_to = match req.query() {
            Some(q) => format!("{}?{q}", req.path()),
            None => req.path().to_string(),
        };
        let return_to = crate::redirect::safe_return_path(&return_to).unwrap_or("/");
        let response = self.answer(&loaded, req, &client, outcome, return_to, cx.worker_id);
        Verdict::Answer(Reply::Now(response))
    }
}

/// The realm a cookie name belongs to: `Some(None)` for a challenge pass, `Some(Some(realm))`
/// for a realm's session, `None` for a cookie that is not the gate's.
fn cookie_realm<'n>(config: &GateConfig, secure: bool, name: &'n [u8]) -> Option<Option<&'n [u8]>> {
    let name = if secure {
        name.strip_prefix(b"__Host-")?
    } else {
        name
    };
    let rest = name.strip_prefix(config.cookie.as_bytes())?;
    match rest {
        [] => Some(None),
        [b'.', realm @ ..] if !realm.is_empty() => Some(Some(realm)),
        _ => None,
    }
}

/// The cookie that carries a session of `realm` ("" for a challenge pass).
pub(crate) fn cookie_name(config: &GateConfig, secure: bool, realm: &str) -> String {
    let mut name = String::with_capacity(config.cookie.len() + realm.len() + 8);
    if secure {
        name.push_str("__Host-");
    }
    name.push_str(&config.cookie);
    if !realm.is_empty() {
        name.push('.');
        name.push_str(realm);
    }
    name
}

/// `Set-Cookie` for a session (`max_age` 0 deletes it).
pub(crate) fn set_cookie(
    config: &GateConfig,
    secure: bool,
    realm: &str,
    value: &str,
    max_age: u64,
) -> String {
    format!(
        "{}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax{}",
        cookie_name(config, secure, realm),
        if secure { "; Secure" } else { "" }
    )
}

/// Content-Security-Policy for the gate's pages: scripts, styles and workers from this site
/// only, forms posting only here, never framed.
pub(crate) const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; worker-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; \
     base-uri 'none'; frame-ancestors 'none'";

/// An HTML page of the gate: never cached, never indexed, never framed.
pub(crate) fn page(status: u16, html: String) -> Response {
    Response::new(status)
        .with_header("Content-Type", "text/html; charset=utf-8")
        .with_header("Cache-Control", "no-store")
        .with_header("Content-Security-Policy", PAGE_CSP)
        .with_header("X-Robots-Tag", "noindex, nofollow")
        .with_header("Referrer-Policy", "same-origin")
        .with_body(tern_server::Body::Owned(html.into_bytes()))
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &b[start..end.max(start)]
}
