//! A proxy route's shared cache (`tern_cache`): the lookup the handler makes, after the
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tern_cache::policy::{self, invalidates, keyed_query};
use tern_cache::{
    judge_answer, judge_request, AnswerFacts, Bypass, Entry, Field, Key, KeyParts, Keyer,
    MethodClass, RequestFacts, RequestVerdict, Rules, Store, Uncacheable,
};
use tern_server::{
    upstream::ResponseEdit, AnswerTee, Body, BodyKind, HandlerContext, Method, Request, Response,
};

/// A route's cache: the store it uses (shared by name) and its rules.
pub struct RouteCache {
    store: Arc<Store>,
    rules: Arc<Rules>,
    /// Which route (and so which site) this is, as the config names it: part of every key.
    route: String,
    /// Writes `Cache-Status` (RFC 9211) on its answers.
    status_field: bool,
    /// The `Cache-Status` edits of answers that went to the app (made once, if written):
    /// a miss, and a request that went past the cache.
    miss_field: Option<(ResponseEdit, ResponseEdit)>,
    counts: Arc<Counts>,
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
    Bypassed(Bypass),
    Uncacheable(Uncacheable),
}

const N_PLAIN: usize = 6;
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

/// What the handler does with a request on a cached route.
pub enum CacheStep {
    /// Answered from the cache.
    Hit(Response),
    /// Not there: forward the keyed request, with this fill for the relay.
    Fill(Box<dyn AnswerTee>),
    /// A HEAD that missed: forwarded keyed, nothing stored (a HEAD answer has no body).
    Keyed,
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
    ) -> RouteCache {
        RouteCache {
            store,
            rules: Arc::new(rules),
            route,
            status_field,
            miss_field: status_field.then(|| {
                let field = |value: &'static [u8]| -> ResponseEdit {
                    Arc::new(move |r: &mut Response| r.push_header("Cache-Status", value))
                };
                (field(b"tern; fwd=miss"), field(b"tern; fwd=bypass"))
            }),
            counts,
        }
    }

    /// The edit that writes `Cache-Status` (RFC 9211) on an answer from the app, if the
    /// route writes it: `fwd=miss` when it was looked up, `fwd=bypass` when it went past.
    /// The relay applies it after the fill's copy, so no entry holds it.
    pub fn forwarded_field(&self, looked_up: bool) -> Option<ResponseEdit> {
        let (miss, bypass) = self.miss_field.as_ref()?;
        Some(if looked_up { miss } else { bypass }.clone())
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

    /// Looks `req` up (`host`: the Host the app is sent).
    pub fn step(&self, req: &Request<'_>, host: &[u8], cx: &HandlerContext<'_>) -> CacheStep {
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
        let key = keyer().key(
            &KeyParts {
                route: &self.route,
                secure: req.secure,
                host,
                path: req.path(),
                query: query.as_deref(),
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
                if let Some(entry) = self.store.get(&key) {
                    if entry.freshness.is_fresh(now) {
                        self.counts.bump(cx.worker_id, Count::Hit);
                        return CacheStep::Hit(self.answer(req, &entry, now, cx.worker_id));
                    }
                    self.counts.bump(cx.worker_id, Count::Expired);
                    self.store.remove(&key);
                }
                self.counts.bump(cx.worker_id, Count::Miss);
                if req.method() == Method::Head {
                    return CacheStep::Keyed;
                }
                CacheStep::Fill(Box::new(Fill {
                    store: self.store.clone(),
                    rules: self.rules.clone(),
                    counts: self.counts.clone(),
                    worker: cx.worker_id,
                    key,
                    authorized: fields
                        .iter()
                        .any(|(n, _)| n.eq_ignore_ascii_case("authorization")),
                    kept: None,
                }))
            }
        }
    }

    /// A fresh entry's answer: its head as stored, `Age` from the worker's clock, its body
    /// shared (a HEAD gets the same head; the connection leaves the body out); 304 when the
    /// client's validators match.
    fn answer(&self, req: &Request<'_>, entry: &Entry, now: u64, worker: usize) -> Response {
        let age = entry.freshness.age(now);
        let mut buf = itoa::Buffer::new();
        if not_modified(req, entry) {
            self.counts.bump(worker, Count::NotModified);
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
            if self.status_field {
                r.push_header("Cache-Status", b"tern; hit");
            }
            return r;
        }
        let mut r = Response::new(entry.status).with_body(Body::Shared(entry.body.clone()));
        r.push_raw_headers(&entry.head);
        r.push_header("Age", buf.format(age).as_bytes());
        if self.status_field {
            r.push_header("Cache-Status", b"tern; hit");
        }
        r
    }

    /// `Cache-Status` for an answer that went to the app, if the route writes it.
    pub fn status_field(&self) -> bool {
        self.status_field
    }
}

/// The client's validators match the entry's (RFC 9110 §13.2.2: If-None-Match first, and
/// If-Modified-Since only without it).
fn not_modified(req: &Request<'_>, entry: &Entry) -> bool {
    if entry.status != 200 {
        return false;
    }
    if let Some(inm) = req.head.if_none_match {
        return entry
            .etag
            .as_deref()
            .is_some_and(|etag| policy::none_match_hits(inm, etag));
    }
    match (req.head.if_modified_since, entry.last_modified.as_deref()) {
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
    authorized: bool,
    /// The head kept, once judged storable.
    kept: Option<Kept>,
}

struct Kept {
    status: u16,
    head: Vec<u8>,
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
    fn refuse(&self, why: Uncacheable) -> bool {
        self.counts.bump(self.worker, Count::Uncacheable(why));
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
        // Each hit writes its own Age (and the connection its own Date).
        let mut stored = Vec::with_capacity(head.headers().len());
        for line in head.headers().split_inclusive(|&b| b == b'\n') {
            let name = line.split(|&b| b == b':').next().unwrap_or_default();
            if !name.eq_ignore_ascii_case(b"age") {
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

    fn end(self: Box<Self>, _unix_secs: u64) {
        let Some(kept) = self.kept else {
            return;
        };
        self.counts.bump(self.worker, Count::Stored);
        self.store.insert(
            self.key,
            Entry {
                status: kept.status,
                head: Bytes::from(kept.head),
                body: Bytes::from(kept.body),
                freshness: kept.freshness,
                etag: kept.etag,
                last_modified: kept.last_modified,
            },
        );
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
