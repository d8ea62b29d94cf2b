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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tern_cache::policy::{self, invalidates, keyed_query};
use tern_cache::purge::{is_tag_field, tags_of};
use tern_cache::{
    judge_answer, judge_request, AnswerFacts, Bypass, Entry, Field, FillMark, Flight, FlightState,
    Join, Key, KeyParts, Keyer, MethodClass, Purge, RequestFacts, RequestVerdict, Rules, Store,
    Target, Uncacheable,
};
use tern_server::static_files::range::{self, RangeSpec};
use tern_server::{
    upstream::ResponseEdit, AnswerTee, Body, BodyKind, Fallback, HandlerContext, Hold, HoldStep,
    Method, Request, Response,
};

/// How often a miss waiting for another request's fill looks again. The worker's timer
/// wheel rounds it up to its tick (100 ms), as nginx's `proxy_cache_lock` looks every 500 ms.
pub const WAIT_POLL_MS: u64 = 10;

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

/// What happened on a cache: one slot each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Hit,
    Miss,
    /// Found, but stale: dropped and fetched again (also counted as a miss).
    Expired,
    /// A hit answered 304 from the client's validators (also counted as a hit).
    NotModified,
    Stored,
    Invalidated,
    /// A miss that waited for another request's fill of its key (then coalesced, timed
    /// out, or sent on).
    Waited,
    /// A miss answered from the fill it waited for.
    Coalesced,
    /// A stale entry served while another request refreshes it.
    StaleUpdating,
    /// A stale entry served because the app failed.
    StaleError,
    /// A stale entry the app confirmed (304 to a conditional refresh).
    Revalidated,
    /// A miss that waited the lock time for another's fill, then went to the app.
    LockTimeout,
    Bypassed(Bypass),
    Uncacheable(Uncacheable),
}

const N_PLAIN: usize = 12;
/// Slots in a block: the plain counts, then one per bypass and one per uncacheable reason.
pub const N_COUNTS: usize = N_PLAIN + Bypass::ALL.len() + Uncacheable::ALL.len();

impl Count {
    fn index(self) -> usize {
        match self {
            Count::Hit => 0,
            Count::Miss => 1,
            Count::Expired => 2,
            Count::NotModified => 3,
            Count::Stored => 4,
            Count::Invalidated => 5,
            Count::Coalesced => 6,
            Count::LockTimeout => 7,
            Count::Waited => 8,
            Count::StaleUpdating => 9,
            Count::StaleError => 10,
            Count::Revalidated => 11,
            Count::Bypassed(b) => N_PLAIN + b as usize,
            Count::Uncacheable(u) => N_PLAIN + Bypass::ALL.len() + u as usize,
        }
    }
}

/// One worker's counts, alone on its cache lines.
#[repr(align(128))]
struct WorkerCounts([AtomicU64; N_COUNTS]);

/// What happened to requests on a cache (shared by the routes using it), counted as the
/// server's own counters are: a block per worker, each written by its worker only (a load and
/// a store, no locked instruction on the hit path), summed when /metrics asks. One more block
/// takes counts from any other thread, with a locked add.
pub struct Counts {
    workers: Box<[WorkerCounts]>,
}

impl Counts {
    pub fn new(workers: usize) -> Counts {
        Counts {
            workers: (0..workers + 1)
                .map(|_| WorkerCounts(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// Counts `c` for worker `worker` (the handler's `HandlerContext::worker_id`, whose
    /// thread this must be).
    pub fn bump(&self, worker: usize, c: Count) {
        let shared = self.workers.len() - 1;
        if worker < shared {
            let slot = &self.workers[worker].0[c.index()];
            slot.store(slot.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        } else {
            self.workers[shared].0[c.index()].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// All workers' counts of `c`.
    pub fn total(&self, c: Count) -> u64 {
        self.workers
            .iter()
            .map(|w| w.0[c.index()].load(Ordering::Relaxed))
            .sum()
    }
}

/// The process's key secret: drawn once, kept across reloads (so entries stay valid).
fn keyer() -> &'static Keyer {
    static KEYER: OnceLock<Keyer> = OnceLock::new();
    KEYER.get_or_init(Keyer::new)
}

type Named = HashMap<String, (u64, Arc<Store>, Arc<Counts>)>;

fn named() -> std::sync::MutexGuard<'static, Named> {
    static STORES: OnceLock<Mutex<Named>> = OnceLock::new();
    STORES
        .get_or_init(|| {
            tern_services::metrics::add_metrics_source(metrics);
            Default::default()
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A named cache and its counts: the same across reloads while its sizes stay the same
/// (`workers`: the server's, which a reload does not change).
pub fn shared_store(
    name: &str,
    memory: u64,
    max_object: u64,
    workers: usize,
) -> (Arc<Store>, Arc<Counts>) {
    let mut stores = named();
    match stores.get(name) {
        Some((m, store, counts)) if *m == memory && store.max_object() == max_object => {
            (store.clone(), counts.clone())
        }
        _ => {
            let store = Arc::new(Store::new(memory, max_object));
            let counts = Arc::new(Counts::new(workers));
            stores.insert(name.to_owned(), (memory, store.clone(), counts.clone()));
            (store, counts)
        }
    }
}

/// Drops what `purge` names from the cache called `name`, or from every cache; how many
/// entries each lost, by name. An unknown name is an error (a typo must not look like a
/// purge that found nothing).
pub fn purge(purge: &Purge, name: Option<&str>) -> Result<Vec<(String, u64)>, String> {
    let stores = named();
    if let Some(name) = name {
        if !stores.contains_key(name) {
            let mut known: Vec<&str> = stores.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(format!(
                "no cache named {name:?} (this server has: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        }
    }
    let mut purged: Vec<(String, u64)> = stores
        .iter()
        .filter(|(n, _)| name.is_none_or(|name| name == n.as_str()))
        .map(|(n, (_, store, _))| (n.clone(), store.purge(purge)))
        .collect();
    purged.sort_unstable();
    Ok(purged)
}

/// Every named cache's figures for /metrics (`tern_cache_*{cache="NAME"}`), the series of
/// one name together.
fn metrics() -> Vec<tern_services::metrics::Metric> {
    use tern_services::metrics::Metric;
    let stores = named();
    let mut caches: Vec<(&String, &Arc<Store>, &Arc<Counts>)> =
        stores.iter().map(|(n, (_, s, c))| (n, s, c)).collect();
    caches.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = Vec::new();
    type Figures<'a> = &'a dyn Fn(&Arc<Store>, &Arc<Counts>) -> Vec<Metric>;
    let mut each = |make: Figures<'_>| {
        for (name, store, counts) in &caches {
            out.extend(
                make(store, counts)
                    .into_iter()
                    .map(|m| m.with_label("cache", (*name).clone())),
            );
        }
    };
    const LOOKUPS: &str = "cached requests looked up, by result: hit (not_modified: a hit \
                           answered 304), miss (expired: a stale entry found)";
    each(&|_, c| {
        [
            (Count::Hit, "hit"),
            (Count::NotModified, "not_modified"),
            (Count::Miss, "miss"),
            (Count::Expired, "expired"),
        ]
        .into_iter()
        .map(|(k, result)| {
            Metric::counter("cache_lookups", LOOKUPS, c.total(k)).with_label("result", result)
        })
        .collect()
    });
    each(&|_, c| {
        Bypass::ALL
            .into_iter()
            .map(|b| {
                Metric::counter(
                    "cache_bypassed",
                    "requests sent past the cache, by cause",
                    c.total(Count::Bypassed(b)),
                )
                .with_label("cause", b.name())
            })
            .collect()
    });
    each(&|_, c| {
        Uncacheable::ALL
            .into_iter()
            .map(|u| {
                Metric::counter(
                    "cache_uncacheable",
                    "answers to misses not stored, by cause",
                    c.total(Count::Uncacheable(u)),
                )
                .with_label("cause", u.name())
            })
            .collect()
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_stored",
            "answers stored",
            c.total(Count::Stored),
        )]
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_invalidations",
            "entries dropped by a successful unsafe method on their target",
            c.total(Count::Invalidated),
        )]
    });
    each(&|_, c| {
        [
            (Count::StaleUpdating, "updating"),
            (Count::StaleError, "error"),
        ]
        .into_iter()
        .map(|(k, reason)| {
            Metric::counter(
                "cache_stale_served",
                "stale entries served, by reason: another request refreshing it, the app failing",
                c.total(k),
            )
            .with_label("reason", reason)
        })
        .collect()
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_revalidated",
            "stale entries the app confirmed (304 to a conditional refresh), refreshed in place",
            c.total(Count::Revalidated),
        )]
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_waits",
            "misses that waited for another request's fill of their key",
            c.total(Count::Waited),
        )]
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_coalesced",
            "misses answered from the fill of another request for their key, which they waited for",
            c.total(Count::Coalesced),
        )]
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_lock_timeouts",
            "misses that waited the lock time for another request's fill, then went to the app uncached",
            c.total(Count::LockTimeout),
        )]
    });
    each(&|s, _| {
        vec![
            Metric::counter("cache_purges", "purges run (tern cache purge)", s.purges()),
            Metric::counter(
                "cache_purged",
                "entries dropped by purges",
                s.purged_entries(),
            ),
        ]
    });
    each(&|s, _| {
        vec![Metric::counter(
            "cache_evictions",
            "entries evicted to make room",
            s.evictions(),
        )]
    });
    each(&|s, _| {
        vec![Metric::gauge(
            "cache_memory_bytes",
            "bytes the entries take (heads, bodies, overhead)",
            s.bytes() as f64,
        )]
    });
    each(&|s, _| {
        vec![Metric::gauge(
            "cache_entries",
            "entries held",
            s.len() as f64,
        )]
    });
    out
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
                let edit = |value: &'static [u8]| -> ResponseEdit {
                    Arc::new(move |r: &mut Response| {
                        r.remove_header("Cache-Tag");
                        r.remove_header("Surrogate-Key");
                        // Not over the one an answer from the cache carries (a waiter's, a
                        // stale one in place of a failure), which the relay edits as the app's.
                        if status_field && !has_own_status(r) {
                            r.push_header("Cache-Status", value)
                        }
                    })
                };
                (
                    edit(b"tern; fwd=miss"),
                    edit(b"tern; fwd=bypass"),
                    edit(b"tern; fwd=stale"),
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
                            return CacheStep::Wait {
                                fallback,
                                hold: Box::new(Waiter {
                                    fill: self.fill(cx.worker_id, key, target(), authorized, None),
                                    flight,
                                    give_up_ms: req.now_ms + self.lock.as_millis() as u64,
                                    head_only,
                                    if_none_match: req.head.if_none_match.map(<[u8]>::to_vec),
                                    if_modified_since: req
                                        .head
                                        .if_modified_since
                                        .map(<[u8]>::to_vec),
                                    status_field: self.status_field,
                                }),
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
        answer(&asked, entry, now, status, || {
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
        answer(&asked, entry, now, status, || {
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

/// The client's validators, and the range a GET asks for (with its `If-Range`).
struct Validators<'a> {
    if_none_match: Option<&'a [u8]>,
    if_modified_since: Option<&'a [u8]>,
    range: Option<(&'a [u8], Option<&'a [u8]>)>,
}

impl<'a> Validators<'a> {
    fn of(req: &Request<'a>) -> Validators<'a> {
        let head = req.head;
        Validators {
            if_none_match: head.if_none_match,
            if_modified_since: head.if_modified_since,
            // RFC 9110 §14.2: a range applies to GET only.
            range: (req.method() == Method::Get)
                .then_some(head.range)
                .flatten()
                .map(|r| (r, head.if_range)),
        }
    }
}

/// The part of a whole 200 entry a GET's `Range` asks for: its bounds, or `None` for the
/// whole entry (no range, one tern ignores, or an `If-Range` the entry no longer matches);
/// `Err` for a range past its end (416).
fn range_of(asked: &Validators<'_>, entry: &Entry) -> Result<Option<(u64, u64)>, ()> {
    let Some((range, if_range)) = asked.range else {
        return Ok(None);
    };
    if entry.status != 200 {
        return Ok(None);
    }
    // If-Range: the entry's strong ETag, or its Last-Modified exactly (RFC 9110 §13.1.5).
    if let Some(ir) = if_range.map(<[u8]>::trim_ascii) {
        let holds = match ir.first() {
            Some(b'"') => entry.etag.as_deref() == Some(ir),
            _ => !ir.starts_with(b"W/") && entry.last_modified.as_deref() == Some(ir),
        };
        if !holds {
            return Ok(None);
        }
    }
    match range::parse(range, entry.body.len() as u64) {
        RangeSpec::Ignore => Ok(None),
        RangeSpec::Satisfiable { start, end } => Ok(Some((start, end))),
        RangeSpec::Unsatisfiable => Err(()),
    }
}

/// A fresh entry's answer: its head as stored, `Age` from the worker's clock, its body
/// shared (a HEAD gets the same head; the connection leaves the body out); 304 when the
/// client's validators match (`not_modified` is told). `status`: its `Cache-Status`, if the
/// route writes it.
fn answer(
    asked: &Validators<'_>,
    entry: &Entry,
    now: u64,
    status: Option<&[u8]>,
    not_modified_counted: impl FnOnce(),
) -> Response {
    {
        let age = entry.freshness.age(now);
        let mut buf = itoa::Buffer::new();
        if not_modified(asked, entry) {
            not_modified_counted();
            let mut r = Response::new(304);
            for line in entry.head.split_inclusive(|&b| b == b'\n') {
                let name = line.split(|&b| b == b':').next().unwrap_or_default();
                // RFC 9110 §15.4.5: the fields a 200 would have carried that describe it.
                if [
                    &b"etag"[..],
                    b"cache-control",
                    b"expires",
                    b"vary",
                    b"last-modified",
                    b"content-location",
                ]
                .iter()
                .any(|n| name.eq_ignore_ascii_case(n))
                {
                    r.push_raw_headers(line);
                }
            }
            r.push_header("Age", buf.format(age).as_bytes());
            if let Some(status) = status {
                r.push_header("Cache-Status", status);
            }
            return r;
        }
        let len = entry.body.len() as u64;
        let mut r = match range_of(asked, entry) {
            Ok(None) => {
                let mut r = Response::new(entry.status).with_body(Body::Shared(entry.body.clone()));
                r.push_raw_headers(&entry.head);
                r
            }
            Ok(Some((start, end))) => {
                let part = entry.body.slice(start as usize..end as usize + 1);
                range::partial(&entry.head, start, end, len).with_body(Body::Shared(part))
            }
            Err(()) => range::unsatisfiable(len),
        };
        r.push_header("Age", buf.format(age).as_bytes());
        if let Some(status) = status {
            r.push_header("Cache-Status", status);
        }
        r
    }
}

/// The client's validators match the entry's (RFC 9110 §13.2.2: If-None-Match first, and
/// If-Modified-Since only without it).
fn not_modified(asked: &Validators<'_>, entry: &Entry) -> bool {
    if entry.status != 200 {
        return false;
    }
    if let Some(inm) = asked.if_none_match {
        return entry
            .etag
            .as_deref()
            .is_some_and(|etag| policy::none_match_hits(inm, etag));
    }
    match (asked.if_modified_since, entry.last_modified.as_deref()) {
        (Some(since), Some(lm)) => policy::not_modified_since(since, lm),
        _ => false,
    }
}

/// The fill of one entry, fed by the relay.
struct Fill {
    store: Arc<Store>,
    rules: Arc<Rules>,
    counts: Arc<Counts>,
    /// The worker whose relay feeds this fill (its counts block).
    worker: usize,
    key: Key,
    /// What the entry is for, and the store's purges when the fill began (one since: not
    /// stored, see `Store::insert_unless_purged`).
    target: Arc<Target>,
    purges: u64,
    authorized: bool,
    /// The head kept, once judged storable.
    kept: Option<Kept>,
    /// The key's fill in flight, which misses for it wait on: ended when this is dropped.
    mark: Option<FillMark>,
    /// The stale entry a conditional refresh asked the app about: a 304 refreshes it.
    refresh: Option<Arc<Entry>>,
    /// Writes `Cache-Status` on the answer it gives for a 304.
    status_field: bool,
}

struct Kept {
    status: u16,
    head: Vec<u8>,
    tags: Vec<Box<str>>,
    body: Vec<u8>,
    freshness: tern_cache::Freshness,
    etag: Option<Bytes>,
    last_modified: Option<Bytes>,
}

/// Fields of a serialised block (`Name: value\r\n` lines).
fn fields_of(block: &[u8]) -> Vec<Field<'_>> {
    block
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r")?;
            let colon = line.iter().position(|&b| b == b':')?;
            let name = std::str::from_utf8(&line[..colon]).ok()?;
            Some((name, line[colon + 1..].trim_ascii()))
        })
        .collect()
}

impl Fill {
    fn refuse(&mut self, why: Uncacheable) -> bool {
        self.counts.bump(self.worker, Count::Uncacheable(why));
        if let Some(mark) = self.mark.as_mut() {
            mark.not_stored();
        }
        false
    }
}

impl AnswerTee for Fill {
    fn head(
        &mut self,
        head: &Response,
        content_length: Option<u64>,
        date: Option<&[u8]>,
        unix_secs: u64,
    ) -> bool {
        let mut fields = fields_of(head.headers());
        // Its Date, for its age when it came (and `Expires − Date`); not stored: each hit
        // goes out with the connection's own Date.
        if let Some(date) = date {
            fields.push(("date", date));
        }
        let facts = AnswerFacts {
            status: head.status,
            fields: &fields,
            content_length,
            authorized: self.authorized,
            now: unix_secs,
        };
        let freshness = match judge_answer(&self.rules, &facts) {
            Ok(f) => f,
            Err(why) => return self.refuse(why),
        };
        // Each hit writes its own Age (and the connection its own Date); the tags are kept
        // apart, for purges, and never sent.
        let mut stored = Vec::with_capacity(head.headers().len());
        for line in head.headers().split_inclusive(|&b| b == b'\n') {
            let name = line.split(|&b| b == b':').next().unwrap_or_default();
            if !name.eq_ignore_ascii_case(b"age") && !is_tag_field(name) {
                stored.extend_from_slice(line);
            }
        }
        let field = |name: &str| {
            policy::values(&fields, name)
                .next()
                .map(Bytes::copy_from_slice)
        };
        self.kept = Some(Kept {
            status: head.status,
            etag: field("etag"),
            last_modified: field("last-modified"),
            head: stored,
            tags: tags_of(fields.iter().copied()),
            body: Vec::with_capacity(
                content_length.unwrap_or(0).min(self.rules.max_object) as usize
            ),
            freshness,
        });
        true
    }

    fn body(&mut self, data: &[u8]) -> bool {
        let Some(kept) = self.kept.as_mut() else {
            return false;
        };
        if (kept.body.len() + data.len()) as u64 > self.rules.max_object {
            self.kept = None;
            return self.refuse(Uncacheable::TooLarge);
        }
        kept.body.extend_from_slice(data);
        true
    }

    fn not_modified(
        &mut self,
        head: &Response,
        date: Option<&[u8]>,
        unix_secs: u64,
    ) -> Option<Response> {
        let old = self.refresh.take()?;
        self.counts.bump(self.worker, Count::Revalidated);
        let status = self
            .status_field
            .then_some(&b"tern; fwd=stale; fwd-status=304"[..]);
        let none = Validators {
            if_none_match: None,
            if_modified_since: None,
            range: None,
        };
        let Some(entry) = self.refreshed(&old, head, date, unix_secs) else {
            // Confirmed, but no longer to be kept (the 304 says no-store, say): this client
            // still gets the body the app confirmed.
            self.store.remove(&self.key);
            if let Some(mark) = self.mark.as_mut() {
                mark.not_stored();
            }
            return Some(answer(&none, &old, unix_secs, status, || {}));
        };
        let r = answer(&none, &entry, unix_secs, status, || {});
        self.counts.bump(self.worker, Count::Stored);
        self.store
            .insert_unless_purged(self.purges, self.key, entry);
        if let Some(mark) = self.mark.as_mut() {
            mark.stored();
        }
        Some(r)
    }

    fn unsized_body(&mut self) {
        // Not counted: nothing was judged. Waiters go to the app rather than take over a
        // fill that would end the same way.
        if let Some(mark) = self.mark.as_mut() {
            mark.not_stored();
        }
    }

    fn end(mut self: Box<Self>, _unix_secs: u64) {
        let Some(kept) = self.kept.take() else {
            return;
        };
        self.counts.bump(self.worker, Count::Stored);
        self.store.insert_unless_purged(
            self.purges,
            self.key,
            Entry {
                status: kept.status,
                head: Bytes::from(kept.head),
                body: Bytes::from(kept.body),
                freshness: kept.freshness,
                etag: kept.etag,
                last_modified: kept.last_modified,
                target: self.target.clone(),
                tags: kept.tags.into(),
            },
        );
        // (The store may still refuse it, over its size: waiters then find no entry and go
        // to the app.)
        if let Some(mark) = self.mark.as_mut() {
            mark.stored();
        }
    }
}

/// A miss waiting for another request's fill of its key (the relay asks it, see
/// [`Hold`]): answered from the entry when the fill stored it, sent to the app when the
/// fill ended without storing or the lock time passed; when the fill was abandoned (the app
/// failed, its client left), the first waiter to see it leads the next fill.
struct Waiter {
    /// Its own fill, should it lead one (its mark then set).
    fill: Fill,
    flight: Arc<Flight>,
    /// When it stops waiting (the worker's clock, ms).
    give_up_ms: u64,
    head_only: bool,
    if_none_match: Option<Vec<u8>>,
    if_modified_since: Option<Vec<u8>>,
    status_field: bool,
}

impl Waiter {
    fn go(&self, counted: Count) -> HoldStep {
        self.fill.counts.bump(self.fill.worker, counted);
        HoldStep::Go(None)
    }
}

impl Hold for Waiter {
    fn poll(&mut self, unix_secs: u64, now_ms: u64) -> HoldStep {
        let worker = self.fill.worker;
        match self.flight.state() {
            FlightState::Filling if now_ms >= self.give_up_ms => self.go(Count::LockTimeout),
            FlightState::Filling => HoldStep::Wait((now_ms + WAIT_POLL_MS).min(self.give_up_ms)),
            FlightState::Stored => {
                let Some(entry) = self.fill.store.get(&self.fill.key) else {
                    return self.go(Count::Miss);
                };
                if !entry.freshness.is_fresh(unix_secs) {
                    return self.go(Count::Miss);
                }
                self.fill.counts.bump(worker, Count::Coalesced);
                let asked = Validators {
                    if_none_match: self.if_none_match.as_deref(),
                    if_modified_since: self.if_modified_since.as_deref(),
                    range: None,
                };
                let status = self
                    .status_field
                    .then_some(&b"tern; hit; detail=coalesced"[..]);
                let counts = &self.fill.counts;
                HoldStep::Answer(answer(&asked, &entry, unix_secs, status, || {
                    counts.bump(worker, Count::NotModified)
                }))
            }
            FlightState::NotStored => self.go(Count::Miss),
            FlightState::Abandoned if now_ms >= self.give_up_ms => self.go(Count::LockTimeout),
            FlightState::Abandoned if self.head_only => self.go(Count::Miss),
            FlightState::Abandoned => match self.fill.store.flights().join(self.fill.key) {
                Join::Lead(mark) => {
                    self.fill.counts.bump(worker, Count::Miss);
                    let mut fill = self.fill.clone_empty();
                    fill.mark = Some(mark);
                    HoldStep::Go(Some(Box::new(fill)))
                }
                Join::Wait(flight) => {
                    self.flight = flight;
                    HoldStep::Wait((now_ms + WAIT_POLL_MS).min(self.give_up_ms))
                }
            },
        }
    }
}

/// A stale entry served in place of a failed app's answer (RFC 5861 `stale-if-error`).
struct StaleOnError {
    entry: Arc<Entry>,
    rules: Arc<Rules>,
    counts: Arc<Counts>,
    worker: usize,
    if_none_match: Option<Vec<u8>>,
    if_modified_since: Option<Vec<u8>>,
    status_field: bool,
}

impl Fallback for StaleOnError {
    fn answer(&mut self, unix_secs: u64) -> Option<Response> {
        // The app may have taken long to fail: the window is judged now.
        if !self.entry.freshness.serves_on_error(&self.rules, unix_secs) {
            return None;
        }
        let (counts, worker) = (&self.counts, self.worker);
        counts.bump(worker, Count::StaleError);
        let asked = Validators {
            if_none_match: self.if_none_match.as_deref(),
            if_modified_since: self.if_modified_since.as_deref(),
            range: None,
        };
        let status = self
            .status_field
            .then_some(&b"tern; fwd=stale; detail=stale-if-error"[..]);
        Some(answer(&asked, &self.entry, unix_secs, status, || {
            counts.bump(worker, Count::NotModified)
        }))
    }
}

impl Fill {
    /// `old` with the fields of the app's 304 (`head`) in place of its own of those names
    /// (RFC 9111 §4.3.4), its lifetime judged again from them; None: not to be kept.
    fn refreshed(
        &self,
        old: &Entry,
        head: &Response,
        date: Option<&[u8]>,
        now: u64,
    ) -> Option<Entry> {
        let name_of = |line: &[u8]| -> Vec<u8> {
            let name = line.split(|&b| b == b':').next().unwrap_or_default();
            name.to_ascii_lowercase()
        };
        let new_names: Vec<Vec<u8>> = head
            .headers()
            .split_inclusive(|&b| b == b'\n')
            .map(name_of)
            .collect();
        let mut merged = Vec::with_capacity(old.head.len() + head.headers().len());
        for line in old.head.split_inclusive(|&b| b == b'\n') {
            if !new_names.contains(&name_of(line)) {
                merged.extend_from_slice(line);
            }
        }
        for line in head.headers().split_inclusive(|&b| b == b'\n') {
            let name = name_of(line);
            if name != b"age" && !is_tag_field(&name) {
                merged.extend_from_slice(line);
            }
        }
        // A 304 with tags tags the entry anew; one without keeps its tags.
        let new_tags = tags_of(fields_of(head.headers()).into_iter());
        let tags = match new_tags.is_empty() {
            true => old.tags.clone(),
            false => new_tags.into(),
        };
        let mut fields = fields_of(&merged);
        if let Some(date) = date {
            fields.push(("date", date));
        }
        let facts = AnswerFacts {
            status: old.status,
            fields: &fields,
            content_length: Some(old.body.len() as u64),
            authorized: self.authorized,
            now,
        };
        let freshness = judge_answer(&self.rules, &facts).ok()?;
        let field = |name: &str| {
            policy::values(&fields, name)
                .next()
                .map(Bytes::copy_from_slice)
        };
        Some(Entry {
            status: old.status,
            etag: field("etag"),
            last_modified: field("last-modified"),
            head: Bytes::from(merged),
            body: old.body.clone(),
            freshness,
            target: old.target.clone(),
            tags,
        })
    }

    /// The same fill, not begun.
    fn clone_empty(&self) -> Fill {
        Fill {
            store: self.store.clone(),
            rules: self.rules.clone(),
            counts: self.counts.clone(),
            worker: self.worker,
            key: self.key,
            target: self.target.clone(),
            // It begins now: a purge before this has nothing of it to drop.
            purges: self.store.purges(),
            authorized: self.authorized,
            kept: None,
            mark: None,
            refresh: None,
            status_field: self.status_field,
        }
    }
}

/// An unsafe method's answer: a success drops the target's entry (RFC 9111 §4.4).
struct Invalidation {
    store: Arc<Store>,
    counts: Arc<Counts>,
    worker: usize,
    key: Key,
}

impl AnswerTee for Invalidation {
    fn head(
        &mut self,
        head: &Response,
        _content_length: Option<u64>,
        _date: Option<&[u8]>,
        _unix_secs: u64,
    ) -> bool {
        if invalidates(head.status) {
            self.counts.bump(self.worker, Count::Invalidated);
            self.store.remove(&self.key);
        }
        false
    }

    fn body(&mut self, _data: &[u8]) -> bool {
        false
    }

    fn end(self: Box<Self>, _unix_secs: u64) {}
}

#[cfg(test)]
mod tests {
    //! Coalescing on the real worker with sockets in memory and its manual clock: many
    //! clients of one worker miss one key together; the upstream the test plays says how
    //! often it was asked.
    use super::*;
    use crate::{GroupOptions, Proxy, ProxyOptions, UpstreamGroup, UpstreamServer};
    use std::net::SocketAddr;
    use tern_server::testing::{MemoryAddr, MemoryPeer, MemoryWorker};
    use tern_server::{Router, ServerConfig, UpstreamAddr};

    const GET: &[u8] = b"GET /a HTTP/1.1\r\nHost: one.test\r\n\r\n";
    const CACHEABLE: &[u8] =
        b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nETag: \"v1\"\r\nContent-Length: 4\r\n\r\nbody";
    const CLIENTS: usize = 200;

    struct Harness {
        w: MemoryWorker,
        addr: MemoryAddr,
        counts: Arc<Counts>,
        store: Arc<Store>,
    }

    fn harness(lock: Duration) -> Harness {
        harness_with(
            lock,
            Rules {
                max_object: 64 * 1024,
                ..Rules::default()
            },
        )
    }

    fn harness_with(lock: Duration, rules: Rules) -> Harness {
        let sock = SocketAddr::from(([127, 0, 0, 1], 9));
        let group = UpstreamGroup::new(
            GroupOptions {
                servers: vec![UpstreamServer::new(UpstreamAddr::Tcp(sock))],
                ..GroupOptions::default()
            },
            1,
        );
        let store = Arc::new(Store::new(1 << 20, 64 * 1024));
        let counts = Arc::new(Counts::new(1));
        let cache = RouteCache::new(
            store.clone(),
            counts.clone(),
            rules,
            "one /".into(),
            true,
            lock,
        );
        let proxy = Proxy::new(Arc::new(group), ProxyOptions::default()).with_cache(cache);
        let mut w = MemoryWorker::new(Router::new().fallback(proxy), ServerConfig::default(), None);
        let addr = MemoryAddr::Tcp(sock);
        w.io().listen(addr.clone());
        Harness {
            w,
            addr,
            counts,
            store,
        }
    }

    impl Harness {
        /// Upstream connections the worker opened since the last call.
        fn upstreams(&mut self) -> Vec<MemoryPeer> {
            std::iter::from_fn(|| self.w.io().accept(&self.addr)).collect()
        }
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// Clients that missed together, each answered once `answered` says so.
    fn clients(h: &mut Harness, n: usize, request: &[u8]) -> Vec<MemoryPeer> {
        (0..n).map(|_| h.w.connect(request)).collect()
    }

    #[test]
    fn concurrent_misses_wait_for_one_fill_and_are_answered_from_it() {
        let mut h = harness(Duration::from_secs(5));
        let clients = clients(&mut h, CLIENTS, GET);
        let ups = h.upstreams();
        assert_eq!(ups.len(), 1, "one request reached the app");
        assert!(text(&ups[0].read()).starts_with("GET /a HTTP/1.1\r\n"));
        assert!(
            clients[1..].iter().all(|c| c.read().is_empty()),
            "they wait"
        );
        ups[0].write(CACHEABLE);
        h.w.settle();
        let first = text(&clients[0].read());
        assert!(first.contains("Cache-Status: tern; fwd=miss"), "{first}");
        // The waiters look again at their next timer.
        h.w.advance(Duration::from_millis(100));
        for c in &clients[1..] {
            let out = text(&c.read());
            assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
            assert!(out.ends_with("\r\n\r\nbody"), "{out}");
            assert!(
                out.contains("Cache-Status: tern; hit; detail=coalesced"),
                "{out}"
            );
            assert!(out.contains("Age: 0\r\n"), "{out}");
        }
        assert!(h.upstreams().is_empty());
        assert_eq!(h.counts.total(Count::Coalesced), CLIENTS as u64 - 1);
        assert_eq!(h.counts.total(Count::Waited), CLIENTS as u64 - 1);
        assert_eq!(h.counts.total(Count::Miss), 1);
        assert_eq!(h.counts.total(Count::Stored), 1);
        assert!(h.store.flights().is_empty());
    }

    #[test]
    fn a_waiter_s_validators_and_a_head_are_answered_from_the_fill() {
        let mut h = harness(Duration::from_secs(5));
        let leader = h.w.connect(GET);
        let conditional =
            h.w.connect(b"GET /a HTTP/1.1\r\nHost: one.test\r\nIf-None-Match: \"v1\"\r\n\r\n");
        let head = h.w.connect(b"HEAD /a HTTP/1.1\r\nHost: one.test\r\n\r\n");
        let ups = h.upstreams();
        assert_eq!(ups.len(), 1);
        ups[0].write(CACHEABLE);
        h.w.advance(Duration::from_millis(100));
        assert!(text(&leader.read()).ends_with("body"));
        let out = text(&conditional.read());
        assert!(out.starts_with("HTTP/1.1 304 "), "{out}");
        let out = text(&head.read());
        assert!(
            out.starts_with("HTTP/1.1 200 ") && out.contains("Content-Length: 4"),
            "{out}"
        );
        assert!(out.ends_with("\r\n\r\n"), "no body: {out}");
        assert_eq!(h.counts.total(Count::Coalesced), 2);
    }

    #[test]
    fn a_head_alone_leads_no_fill() {
        let mut h = harness(Duration::from_secs(5));
        let _a = h.w.connect(b"HEAD /a HTTP/1.1\r\nHost: one.test\r\n\r\n");
        let _b = h.w.connect(b"HEAD /a HTTP/1.1\r\nHost: one.test\r\n\r\n");
        assert_eq!(h.upstreams().len(), 2, "both go: neither fills");
        assert!(h.store.flights().is_empty());
    }

    #[test]
    fn after_the_lock_time_waiters_go_to_the_app_themselves() {
        let mut h = harness(Duration::from_millis(1000));
        let clients = clients(&mut h, 20, GET);
        let leader = h.upstreams();
        assert_eq!(leader.len(), 1);
        h.w.advance(Duration::from_millis(900));
        assert!(h.upstreams().is_empty(), "still within the lock time");
        h.w.advance(Duration::from_millis(200));
        let own = h.upstreams();
        assert_eq!(own.len(), 19, "each waiter went itself");
        assert_eq!(h.counts.total(Count::LockTimeout), 19);
        for up in &own {
            assert!(text(&up.read()).starts_with("GET /a "));
            up.write(
                b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 3\r\n\r\nown",
            );
        }
        h.w.settle();
        for c in &clients[1..] {
            let out = text(&c.read());
            assert!(out.ends_with("own") && out.contains("fwd=miss"), "{out}");
        }
        // Their answers were not stored (they were not the fill), the leader's still may be.
        assert_eq!(h.counts.total(Count::Stored), 0);
        assert!(
            !h.store.flights().is_empty(),
            "the leader's fill is still under way"
        );
        leader[0].write(CACHEABLE);
        h.w.settle();
        assert!(text(&clients[0].read()).ends_with("body"));
        assert_eq!(h.counts.total(Count::Stored), 1);
        assert!(h.store.flights().is_empty());
    }

    #[test]
    fn an_answer_not_stored_sends_the_waiters_to_the_app() {
        for (answer, why) in [
            (
                &b"HTTP/1.1 200 OK\r\nCache-Control: private, max-age=60\r\nContent-Length: 2\r\n\r\nme"[..],
                "private",
            ),
            (
                b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nConnection: close\r\n\r\nuntil close",
                "no length",
            ),
        ] {
            let mut h = harness(Duration::from_secs(5));
            let clients = clients(&mut h, 10, GET);
            let leader = h.upstreams();
            assert_eq!(leader.len(), 1);
            leader[0].write(answer);
            leader[0].shutdown();
            h.w.advance(Duration::from_millis(100));
            assert!(h.store.flights().is_empty(), "{why}");
            let own = h.upstreams();
            assert_eq!(own.len(), 9, "{why}: each waiter goes to the app");
            assert_eq!(h.counts.total(Count::Coalesced), 0);
            for up in &own {
                up.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nown");
            }
            h.w.settle();
            assert!(clients[1..].iter().all(|c| text(&c.read()).ends_with("own")), "{why}");
            assert!(h.store.flights().is_empty());
        }
    }

    #[test]
    fn a_failed_fill_is_taken_over_by_one_waiter() {
        let mut h = harness(Duration::from_secs(5));
        let clients = clients(&mut h, 10, GET);
        let leader = h.upstreams();
        assert_eq!(leader.len(), 1);
        // The app closes without answering: the leader's client gets tern's 502.
        leader[0].shutdown();
        h.w.settle();
        assert!(text(&clients[0].read()).starts_with("HTTP/1.1 502 "));
        h.w.advance(Duration::from_millis(100));
        let next = h.upstreams();
        assert_eq!(next.len(), 1, "one waiter took the fill over");
        assert_eq!(h.store.flights().len(), 1);
        next[0].write(CACHEABLE);
        h.w.advance(Duration::from_millis(200));
        for c in &clients[1..] {
            let out = text(&c.read());
            assert!(
                out.starts_with("HTTP/1.1 200 ") && out.ends_with("body"),
                "{out}"
            );
        }
        assert_eq!(h.counts.total(Count::Coalesced), 8);
        assert_eq!(h.counts.total(Count::Stored), 1);
        assert!(h.store.flights().is_empty());
    }

    #[test]
    fn no_lock_time_no_waiting() {
        let mut h = harness(Duration::ZERO);
        let _clients = clients(&mut h, 5, GET);
        assert_eq!(h.upstreams().len(), 5);
        assert!(h.store.flights().is_empty());
    }

    /// Fresh for a second.
    const BRIEF: &[u8] =
        b"HTTP/1.1 200 OK\r\nCache-Control: max-age=1\r\nContent-Length: 3\r\n\r\nold";
    const NEW: &[u8] =
        b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 3\r\n\r\nnew";

    /// A harness whose entry for /a (BRIEF) went stale 2 s ago.
    fn stale(rules: Rules) -> Harness {
        let mut h = harness_with(Duration::from_secs(5), rules);
        let c = h.w.connect(GET);
        let up = h.upstreams();
        up[0].write(BRIEF);
        h.w.settle();
        assert!(text(&c.read()).ends_with("old"));
        up[0].shutdown();
        h.w.advance(Duration::from_secs(3));
        h
    }

    #[test]
    fn a_stale_entry_answers_at_once_while_one_request_refreshes_it() {
        let mut h = stale(Rules {
            stale_while_updating: 10,
            ..Rules::default()
        });
        let refresher = h.w.connect(GET);
        let ups = h.upstreams();
        assert_eq!(ups.len(), 1, "one refresh");
        let others = clients(&mut h, 20, GET);
        for c in &others {
            let out = text(&c.read());
            assert!(out.ends_with("old"), "answered at once: {out}");
            assert!(
                out.contains("Cache-Status: tern; hit; detail=stale"),
                "{out}"
            );
            assert!(out.contains("Age: 3\r\n"), "{out}");
        }
        assert!(h.upstreams().is_empty());
        ups[0].write(NEW);
        h.w.settle();
        let out = text(&refresher.read());
        assert!(
            out.ends_with("new") && out.contains("tern; fwd=stale"),
            "{out}"
        );
        let next = h.w.connect(GET);
        let out = text(&next.read());
        assert!(
            out.ends_with("new") && out.contains("Cache-Status: tern; hit\r\n"),
            "{out}"
        );
        assert_eq!(h.counts.total(Count::StaleUpdating), 20);
        assert!(h.store.flights().is_empty());
    }

    #[test]
    fn past_its_window_a_stale_entry_is_not_served() {
        let mut h = stale(Rules {
            stale_while_updating: 1,
            ..Rules::default()
        });
        let _refresher = h.w.connect(GET);
        assert_eq!(h.upstreams().len(), 1);
        assert!(h.store.is_empty(), "dropped: stale past every window");
        let waiter = h.w.connect(GET);
        assert!(
            waiter.read().is_empty(),
            "waits for the fill, no stale answer"
        );
        assert_eq!(h.counts.total(Count::StaleUpdating), 0);
    }

    #[test]
    fn a_stale_entry_answers_when_the_app_fails_within_its_window() {
        let mut h = stale(Rules {
            stale_if_error: 60,
            ..Rules::default()
        });
        // A 5xx from the app.
        let c = h.w.connect(GET);
        let up = h.upstreams();
        up[0].write(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy");
        h.w.settle();
        let out = text(&c.read());
        assert!(
            out.starts_with("HTTP/1.1 200 ") && out.ends_with("old"),
            "{out}"
        );
        assert!(
            out.contains("tern; fwd=stale; detail=stale-if-error"),
            "{out}"
        );
        assert!(!up[0].closed_by_worker(), "the 503 was read whole: pooled");
        // No answer at all: tern's 502 is replaced too.
        let c = h.w.connect(GET);
        up[0].read();
        up[0].shutdown();
        h.w.settle();
        // (A pooled connection that closed unasked is retried once on a new one.)
        for fresh in h.upstreams() {
            fresh.shutdown();
        }
        h.w.settle();
        let out = text(&c.read());
        assert!(
            out.starts_with("HTTP/1.1 200 ") && out.ends_with("old"),
            "{out}"
        );
        assert_eq!(h.counts.total(Count::StaleError), 2);
        // Past the window the app's failure is the answer.
        h.w.advance(Duration::from_secs(60));
        let c = h.w.connect(GET);
        let up = h.upstreams();
        up[0].write(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy");
        h.w.settle();
        assert!(text(&c.read()).starts_with("HTTP/1.1 503 "));
        assert!(h.store.flights().is_empty());
    }

    #[test]
    fn must_revalidate_is_never_served_stale() {
        let mut h = harness_with(
            Duration::from_secs(5),
            Rules {
                stale_while_updating: 60,
                stale_if_error: 60,
                ..Rules::default()
            },
        );
        let c = h.w.connect(GET);
        let up = h.upstreams();
        up[0].write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=1, must-revalidate\r\nContent-Length: 3\r\n\r\nold");
        h.w.settle();
        assert!(text(&c.read()).ends_with("old"));
        h.w.advance(Duration::from_secs(3));
        let c = h.w.connect(GET);
        up[0].read();
        up[0].write(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy");
        h.w.settle();
        assert!(text(&c.read()).starts_with("HTTP/1.1 503 "));
    }

    #[test]
    fn the_answer_s_own_stale_while_revalidate_is_honoured() {
        let mut h = harness(Duration::from_secs(5));
        let c = h.w.connect(GET);
        let up = h.upstreams();
        up[0].write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=1, stale-while-revalidate=30\r\nContent-Length: 3\r\n\r\nold");
        h.w.settle();
        assert!(text(&c.read()).ends_with("old"));
        h.w.advance(Duration::from_secs(3));
        let _refresher = h.w.connect(GET);
        let other = h.w.connect(GET);
        assert!(text(&other.read()).ends_with("old"), "served stale at once");
        assert_eq!(h.counts.total(Count::StaleUpdating), 1);
    }

    #[test]
    fn a_stale_entry_with_validators_is_revalidated_and_a_304_refreshes_it() {
        let mut h = harness(Duration::from_secs(5));
        let c = h.w.connect(GET);
        let up = h.upstreams();
        up[0].write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=1\r\nETag: \"v1\"\r\nLast-Modified: Sat, 01 Jan 2028 00:00:00 GMT\r\nX-Version: 1\r\nContent-Length: 3\r\n\r\nold");
        h.w.settle();
        assert!(text(&c.read()).ends_with("old"));
        h.w.advance(Duration::from_secs(3));
        assert_eq!(
            h.store.len(),
            1,
            "kept past its lifetime: it can be revalidated"
        );
        let c = h.w.connect(GET);
        let asked = text(&up[0].read());
        assert!(asked.contains("If-None-Match: \"v1\"\r\n"), "{asked}");
        assert!(
            asked.contains("If-Modified-Since: Sat, 01 Jan 2028 00:00:00 GMT\r\n"),
            "{asked}"
        );
        up[0].write(b"HTTP/1.1 304 Not Modified\r\nCache-Control: max-age=60\r\nETag: \"v1\"\r\nX-Version: 2\r\n\r\n");
        h.w.settle();
        let out = text(&c.read());
        assert!(
            out.starts_with("HTTP/1.1 200 OK\r\n") && out.ends_with("old"),
            "{out}"
        );
        assert!(
            out.contains("Cache-Status: tern; fwd=stale; fwd-status=304"),
            "{out}"
        );
        assert!(
            out.contains("X-Version: 2") && !out.contains("X-Version: 1"),
            "{out}"
        );
        assert!(!up[0].closed_by_worker(), "the 304's connection is pooled");
        // Fresh again, with the 304's fields.
        h.w.advance(Duration::from_secs(3));
        let c = h.w.connect(GET);
        let out = text(&c.read());
        assert!(
            out.contains("Cache-Status: tern; hit\r\n") && out.ends_with("old"),
            "{out}"
        );
        assert!(
            out.contains("Cache-Control: max-age=60") && out.contains("X-Version: 2"),
            "{out}"
        );
        assert!(h.upstreams().is_empty());
        assert_eq!(h.counts.total(Count::Revalidated), 1);
        assert!(h.store.flights().is_empty());
    }

    #[test]
    fn a_new_answer_to_a_conditional_refresh_replaces_the_entry() {
        let mut h = harness(Duration::from_secs(5));
        let c = h.w.connect(GET);
        let up = h.upstreams();
        up[0].write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=1\r\nETag: \"v1\"\r\nContent-Length: 3\r\n\r\nold");
        h.w.settle();
        c.read();
        h.w.advance(Duration::from_secs(3));
        let c = h.w.connect(GET);
        assert!(text(&up[0].read()).contains("If-None-Match: \"v1\""));
        up[0].write(NEW);
        h.w.settle();
        assert!(text(&c.read()).ends_with("new"));
        assert!(
            text(&h.w.connect(GET).read()).ends_with("new"),
            "a hit on the new one"
        );
        assert_eq!(h.counts.total(Count::Revalidated), 0);
    }

    #[test]
    fn an_app_s_own_cache_status_is_kept_beside_tern_s() {
        let mut h = harness(Duration::from_secs(5));
        let c = h.w.connect(GET);
        let up = h.upstreams();
        up[0].write(
            b"HTTP/1.1 200 OK\r\nCache-Status: app-cache; hit\r\nContent-Length: 2\r\n\r\nok",
        );
        h.w.settle();
        let out = text(&c.read());
        assert!(out.contains("Cache-Status: app-cache; hit\r\n"), "{out}");
        assert!(out.contains("Cache-Status: tern; fwd=miss\r\n"), "{out}");
    }

    /// An HTTP/2 frame: length, type, flags, stream, payload.
    fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([ty, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }

    /// A GET of /a on stream 1, every field a literal without indexing (RFC 7541 §6.2.2).
    fn h2_get() -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "one.test"),
            (":path", "/a"),
        ] {
            block.push(0);
            block.push(name.len() as u8);
            block.extend(name.as_bytes());
            block.push(value.len() as u8);
            block.extend(value.as_bytes());
        }
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend(frame(4, 0, 0, &[])); // SETTINGS
        hello.extend(frame(1, 0x4 | 0x1, 1, &block)); // HEADERS, END_HEADERS | END_STREAM
        hello
    }

    #[test]
    fn a_fill_whose_client_left_is_taken_over_by_one_waiter() {
        let mut h = harness(Duration::from_secs(5));
        let leader = h.w.connect(&h2_get());
        let waiters = clients(&mut h, 5, GET);
        let ups = h.upstreams();
        assert_eq!(ups.len(), 1);
        // The leader's client cancels its stream (RST_STREAM, CANCEL): its relay ends.
        leader.write(&frame(3, 0, 1, &8u32.to_be_bytes()));
        h.w.settle();
        assert!(ups[0].closed_by_worker(), "the fill's upstream is let go");
        h.w.advance(Duration::from_millis(100));
        let next = h.upstreams();
        assert_eq!(next.len(), 1, "one waiter took the fill over");
        next[0].write(CACHEABLE);
        h.w.advance(Duration::from_millis(200));
        for c in &waiters {
            assert!(text(&c.read()).ends_with("body"));
        }
        assert_eq!(h.counts.total(Count::Coalesced), 4);
        assert!(h.store.flights().is_empty());
    }
}
