//! A proxy or PHP route's shared cache (`tern_cache`): the lookup the handler makes, after the
//! site's gate and the route's guard have let the request through (a cached page never skips
//! them), and the fill the relay feeds as it writes a miss's answer ([`tern_server::AnswerTee`]).
//!
//! What reaches the app on a cached request is what the key holds, nothing more: the request
//! line (canonical path, the query as keyed), Host as tern chose it, tern's own forwarding
//! fields, and of the client's fields only the route's `cache_key_headers`
//! (`head::build_keyed`). So no unkeyed field (`X-Forwarded-Host`, `Accept`, a cookie the
//! route calls harmless, `User-Agent`...) can change an answer that others will get; the app
//! sees no `Accept-Encoding` either, answers in identity, and tern compresses each hit for its
//! client. `Vary` then needs no second key: every field the app could vary on is in the key
//! already (`Vary: *` is still never stored). Requests that bypass the cache go as they came.
//! A PHP route (`fastcgi.rs`) makes the same lookup on the script the path resolved to, and
//! turns the same keyed head into its `HTTP_*` parameters.
//!
//! Misses for a key another request is fetching wait for that fetch (`tern_cache::flight`):
//! the handler forwards them held (`Waiter`, a [`Hold`] the relay asks in its wait phase),
//! so no worker and no connection's other streams wait with them, and a hit never touches
//! the table. A stale entry still within a window it may be served in answers those
//! waiters at once, stands in for a failed app (`StaleOnError`, a [`Fallback`]), and when
//! it has a validator makes its refresh conditional: the app's 304 refreshes it in place
//! (`Fill::not_modified`).

mod answer;
mod counts;
mod fill;
mod registry;
#[cfg(test)]
mod tests;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use answer::{answer, Validators};
use fill::{fields_of, Fill, Invalidation};
use registry::keyer;
use tern_cache::policy::keyed_query;
use tern_cache::{
    judge_request, Entry, Field, FillMark, Join, Key, KeyParts, MethodClass, RequestFacts,
    RequestVerdict, Rules, Store, Target,
};
use tern_server::{
    upstream::ResponseEdit, AnswerTee, BodyKind, CacheOutcome, Fallback, HandlerContext, Hold,
    Method, Request, Response,
};
use wait::{StaleOnError, Waiter};

pub use counts::{Count, Counts, N_COUNTS};
pub use registry::{purge, shared_store, StoreShape};
pub use wait::WAIT_POLL_MS;

/// A route's cache: the store it uses (shared by name) and its rules.
pub struct RouteCache {
    store: Arc<Store>,
    rules: Arc<Rules>,
    /// Which route (and so which site) this is, as the config names it: part of every key.
    route: String,
    /// Writes `Cache-Status` (RFC 9211) on its answers.
    status_field: bool,
    /// The edits of answers from the app (made once): the app's tags taken off (they are
    /// for purging, never for clients), and `Cache-Status` if written, for a miss, a request
    /// that went past the cache and a stale entry's refresh.
    app_edits: (ResponseEdit, ResponseEdit, ResponseEdit),
    counts: Arc<Counts>,
    /// How long a miss waits for another request's fill of its key before it goes to the
    /// app itself, uncached (nginx's `proxy_cache_lock_timeout`); zero: misses never wait.
    lock: Duration,
}

/// A request on a cached route, as its handler acts on it.
pub enum Lookup {
    /// Answered from the cache.
    Hit(Response),
    /// To the app, so.
    Forward(Forwarding),
}

/// How a request goes to the app from a cached route (or a route without a cache:
/// [`Forwarding::plain`]).
pub struct Forwarding {
    /// Only what the key holds may reach the app: the query as keyed, the route's
    /// `cache_key_headers`, tern's own fields. False: the request went past the cache and goes
    /// as it came.
    pub keyed: bool,
    /// Request fields that make a stale entry's refresh conditional, as header lines.
    pub validators: Vec<u8>,
    /// The relay's hooks ([`tern_server::Forward`]'s fields of these names).
    pub edit: Option<ResponseEdit>,
    pub tee: Option<Box<dyn AnswerTee>>,
    pub hold: Option<Box<dyn Hold>>,
    pub fallback: Option<Box<dyn Fallback>>,
}

impl Forwarding {
    /// A route without a cache: the request as it came, no hooks.
    pub fn plain() -> Forwarding {
        Forwarding {
            keyed: false,
            validators: Vec::new(),
            edit: None,
            tee: None,
            hold: None,
            fallback: None,
        }
    }

    /// When the relay first sends it (`Forward::not_before_ms`): a held request is first
    /// asked again after a poll's wait.
    pub fn not_before_ms(&self, now_ms: u64) -> u64 {
        match self.hold {
            Some(_) => now_ms + WAIT_POLL_MS,
            None => 0,
        }
    }
}

/// What the handler does with a request on a cached route.
pub enum CacheStep {
    /// Answered from the cache.
    Hit(Response),
    /// Not there: forward the keyed request, with this fill for the relay.
    Fill(Box<dyn AnswerTee>),
    /// A HEAD that missed: forwarded keyed, nothing stored (a HEAD answer has no body).
    Keyed,
    /// Another request is filling the key: forward keyed, held until that fill ends (then
    /// answered from it, or sent on) or the lock time passes.
    /// With a stale entry that may answer if the app fails, should the wait end at the app.
    Wait {
        hold: Box<dyn Hold>,
        fallback: Option<Box<dyn Fallback>>,
    },
    /// A stale entry that may still answer if the app fails: forward keyed (a GET refreshing
    /// it with this fill), with the entry as the fallback.
    Refresh {
        tee: Option<Box<dyn AnswerTee>>,
        fallback: Option<Box<dyn Fallback>>,
        /// Request fields that make the refresh conditional (`If-None-Match`,
        /// `If-Modified-Since` from the entry), as header lines: a 304 refreshes the entry.
        validators: Vec<u8>,
    },
    /// Past the cache: forward as usual.
    Pass,
    /// An unsafe method: forward as usual; its success drops the target's entry.
    Invalidate(Box<dyn AnswerTee>),
}

impl RouteCache {
    pub fn new(
        store: Arc<Store>,
        counts: Arc<Counts>,
        rules: Rules,
        route: String,
        status_field: bool,
        lock: Duration,
    ) -> RouteCache {
        RouteCache {
            store,
            rules: Arc::new(rules),
            route,
            status_field,
            app_edits: {
                let edit = |value: &'static [u8], outcome: CacheOutcome| -> ResponseEdit {
                    Arc::new(move |r: &mut Response| {
                        r.remove_header("Cache-Tag");
                        r.remove_header("Surrogate-Key");
                        r.cache_outcome.get_or_insert(outcome);
                        // Not over the one an answer from the cache carries (a waiter's, a
                        // stale one in place of a failure), which the relay edits as the app's.
                        if status_field && !has_own_status(r) {
                            r.push_header("Cache-Status", value)
                        }
                    })
                };
                (
                    edit(b"tern; fwd=miss", CacheOutcome::Miss),
                    edit(b"tern; fwd=bypass", CacheOutcome::Bypass),
                    edit(b"tern; fwd=stale", CacheOutcome::Expired),
                )
            },
            counts,
            lock,
        }
    }

    /// The edit of an answer from the app: its tags off, and `Cache-Status` (RFC 9211) if
    /// the route writes it, `fwd=miss` when it was looked up, `fwd=bypass` when it went past.
    /// The relay applies it after the fill's copy, so no entry holds that field.
    pub fn forwarded_field(&self, looked_up: bool) -> Option<ResponseEdit> {
        let (miss, bypass, _) = &self.app_edits;
        Some(if looked_up { miss } else { bypass }.clone())
    }

    /// The edit of a stale entry's refresh (`fwd=stale`).
    pub fn refresh_field(&self) -> Option<ResponseEdit> {
        Some(self.app_edits.2.clone())
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    pub fn counts(&self) -> &Arc<Counts> {
        &self.counts
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// What a request on this route does: answered from the cache, or forwarded with the
    /// hooks the relay takes (`host`, `script`: as for [`RouteCache::step`]). The one
    /// reading of [`CacheStep`] for the handlers (`Proxy`, `FastCgi`).
    pub fn lookup(
        &self,
        req: &Request<'_>,
        host: &[u8],
        script: &[&str],
        cx: &HandlerContext<'_>,
    ) -> Lookup {
        let mut f = Forwarding {
            keyed: true,
            validators: Vec::new(),
            edit: self.forwarded_field(true),
            tee: None,
            hold: None,
            fallback: None,
        };
        match self.step(req, host, script, cx) {
            CacheStep::Hit(answer) => return Lookup::Hit(answer),
            CacheStep::Pass => {
                f.keyed = false;
                f.edit = self.forwarded_field(false);
            }
            CacheStep::Invalidate(tee) => {
                f.keyed = false;
                f.edit = self.forwarded_field(false);
                f.tee = Some(tee);
            }
            CacheStep::Fill(tee) => f.tee = Some(tee),
            CacheStep::Keyed => {}
            CacheStep::Wait { hold, fallback } => {
                f.hold = Some(hold);
                f.fallback = fallback;
            }
            CacheStep::Refresh {
                tee,
                fallback,
                validators,
            } => {
                f.tee = tee;
                f.fallback = fallback;
                f.validators = validators;
                f.edit = self.refresh_field();
            }
        }
        Lookup::Forward(f)
    }

    /// Looks `req` up (`host`: the Host the app is sent; `script`: what else a FastCGI
    /// script is told of the target, see [`KeyParts::script`]).
    pub fn step(
        &self,
        req: &Request<'_>,
        host: &[u8],
        script: &[&str],
        cx: &HandlerContext<'_>,
    ) -> CacheStep {
        let fields: Vec<Field<'_>> = req.head.headers.iter().map(|h| (h.name, h.value)).collect();
        let method = match req.method() {
            Method::Get | Method::Head => MethodClass::Read,
            Method::Post | Method::Put | Method::Delete | Method::Patch => MethodClass::Unsafe,
            _ => MethodClass::Other,
        };
        let facts = RequestFacts {
            method,
            fields: &fields,
            has_body: !req.body.is_empty() || !matches!(req.head.body, BodyKind::None),
            identity: cx.identity().is_some(),
        };
        let verdict = judge_request(&self.rules, &facts);
        let query = keyed_query(&self.rules.key_query, req.query());
        // What a fill stores the entry for (a purge names it so); made on a miss only.
        let target = || Arc::new(Target::new(host, req.path(), query.as_deref()));
        let key = keyer().key(
            &KeyParts {
                route: &self.route,
                secure: req.secure,
                host,
                path: req.path(),
                query: query.as_deref(),
                script,
            },
            &self.rules.key_headers,
            &fields,
        );
        match verdict {
            RequestVerdict::Bypass(why) => {
                self.counts.bump(cx.worker_id, Count::Bypassed(why));
                CacheStep::Pass
            }
            RequestVerdict::Invalidate => CacheStep::Invalidate(Box::new(Invalidation {
                store: self.store.clone(),
                counts: self.counts.clone(),
                worker: cx.worker_id,
                key,
            })),
            RequestVerdict::Lookup => {
                let now = req.unix_secs;
                // A fresh entry: from this worker's front when it is hot (no lock, nothing
                // shared written), else from the store.
                let fresh = |e: &Entry| {
                    e.freshness
                        .is_fresh(now)
                        .then(|| self.answer(req, e, now, cx.worker_id))
                };
                if let Some(answer) = self.store.answer_hot(&key, fresh) {
                    self.counts.bump(cx.worker_id, Count::Hit);
                    return CacheStep::Hit(answer);
                }
                // A stale entry still within a window it may be served in.
                let mut stale = None;
                if let Some(entry) = self.store.get(&key) {
                    if entry.freshness.is_fresh(now) {
                        self.counts.bump(cx.worker_id, Count::Hit);
                        return CacheStep::Hit(self.answer(req, &entry, now, cx.worker_id));
                    }
                    self.counts.bump(cx.worker_id, Count::Expired);
                    if entry.freshness.worth_keeping(&self.rules, now) || revalidatable(&entry) {
                        stale = Some(entry);
                    } else {
                        self.store.remove(&key);
                    }
                }
                let authorized = fields
                    .iter()
                    .any(|(n, _)| n.eq_ignore_ascii_case("authorization"));
                let head_only = req.method() == Method::Head;
                // A stale entry is refreshed by one request at a time, lock time or not.
                let mark = if self.lock.is_zero() && stale.is_none() {
                    None
                } else {
                    // A HEAD waits for a GET's fill but never leads one (its answer has no
                    // body to store).
                    let joined = match head_only {
                        true => self.store.flights().watch(key).map(Join::Wait),
                        false => Some(self.store.flights().join(key)),
                    };
                    match joined {
                        Some(Join::Wait(_))
                            if stale.as_ref().is_some_and(|e| {
                                e.freshness.serves_while_updating(&self.rules, now)
                            }) =>
                        {
                            let entry = stale.as_ref().expect("just seen");
                            self.counts.bump(cx.worker_id, Count::StaleUpdating);
                            return CacheStep::Hit(self.answer_stale(
                                req,
                                entry,
                                now,
                                cx.worker_id,
                            ));
                        }
                        Some(Join::Wait(_)) if self.lock.is_zero() => None,
                        Some(Join::Wait(flight)) => {
                            self.counts.bump(cx.worker_id, Count::Waited);
                            let fallback =
                                stale.and_then(|e| self.stale_on_error(req, e, cx.worker_id));
                            let waiter = Waiter {
                                fill: self.fill(cx.worker_id, key, target(), authorized, None),
                                flight,
                                waker: cx.hold_waker(),
                                give_up_ms: req.now_ms + self.lock.as_millis() as u64,
                                head_only,
                                if_none_match: req.head.if_none_match.map(<[u8]>::to_vec),
                                if_modified_since: req.head.if_modified_since.map(<[u8]>::to_vec),
                                status_field: self.status_field,
                            };
                            waiter.watch();
                            return CacheStep::Wait {
                                fallback,
                                hold: Box::new(waiter),
                            };
                        }
                        Some(Join::Lead(mark)) => Some(mark),
                        None => None,
                    }
                };
                self.counts.bump(cx.worker_id, Count::Miss);
                if let Some(entry) = stale {
                    // A GET asks the app whether the entry still holds (RFC 9111 §4.3.1).
                    let mut validators = Vec::new();
                    let mut tee = None;
                    if !head_only {
                        let mut fill = self.fill(cx.worker_id, key, target(), authorized, mark);
                        if revalidatable(&entry) {
                            for (name, value) in [
                                ("If-None-Match: ", &entry.etag),
                                ("If-Modified-Since: ", &entry.last_modified),
                            ] {
                                if let Some(v) = value {
                                    validators.extend_from_slice(name.as_bytes());
                                    validators.extend_from_slice(v);
                                    validators.extend_from_slice(b"\r\n");
                                }
                            }
                            fill.refresh = Some(entry.clone());
                        }
                        tee = Some(Box::new(fill) as Box<dyn AnswerTee>);
                    }
                    let fallback = self.stale_on_error(req, entry, cx.worker_id);
                    return CacheStep::Refresh {
                        tee,
                        fallback,
                        validators,
                    };
                }
                if head_only {
                    return CacheStep::Keyed;
                }
                let fill = self.fill(cx.worker_id, key, target(), authorized, mark);
                CacheStep::Fill(Box::new(fill))
            }
        }
    }

    fn fill(
        &self,
        worker: usize,
        key: Key,
        target: Arc<Target>,
        authorized: bool,
        mark: Option<FillMark>,
    ) -> Fill {
        Fill {
            purges: self.store.purges(),
            target,
            store: self.store.clone(),
            rules: self.rules.clone(),
            counts: self.counts.clone(),
            worker,
            key,
            authorized,
            kept: None,
            mark,
            refresh: None,
            status_field: self.status_field,
        }
    }

    fn answer(&self, req: &Request<'_>, entry: &Entry, now: u64, worker: usize) -> Response {
        let asked = Validators::of(req);
        let status = self.status_field.then_some(&b"tern; hit"[..]);
        answer(&asked, entry, now, status, CacheOutcome::Hit, || {
            self.counts.bump(worker, Count::NotModified)
        })
    }

    /// The fallback of a request for a stale entry, if the entry may answer when the app
    /// fails.
    fn stale_on_error(
        &self,
        req: &Request<'_>,
        entry: Arc<Entry>,
        worker: usize,
    ) -> Option<Box<dyn Fallback>> {
        if !entry.freshness.serves_on_error(&self.rules, req.unix_secs) {
            return None;
        }
        Some(Box::new(StaleOnError {
            entry,
            rules: self.rules.clone(),
            counts: self.counts.clone(),
            worker,
            if_none_match: req.head.if_none_match.map(<[u8]>::to_vec),
            if_modified_since: req.head.if_modified_since.map(<[u8]>::to_vec),
            status_field: self.status_field,
        }))
    }

    /// A stale entry's answer while another request refreshes it.
    fn answer_stale(&self, req: &Request<'_>, entry: &Entry, now: u64, worker: usize) -> Response {
        let asked = Validators::of(req);
        let status = self.status_field.then_some(&b"tern; hit; detail=stale"[..]);
        answer(&asked, entry, now, status, CacheOutcome::Updating, || {
            self.counts.bump(worker, Count::NotModified)
        })
    }

    /// `Cache-Status` for an answer that went to the app, if the route writes it.
    pub fn status_field(&self) -> bool {
        self.status_field
    }
}

/// `r` carries tern's `Cache-Status` already (an answer from the cache); an app's own (an
/// upstream cache's) does not count.
fn has_own_status(r: &Response) -> bool {
    fields_of(r.headers())
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("cache-status") && v.starts_with(b"tern;"))
}

/// An entry the app can be asked about: a whole answer with a validator.
fn revalidatable(entry: &Entry) -> bool {
    entry.status == 200 && (entry.etag.is_some() || entry.last_modified.is_some())
}
